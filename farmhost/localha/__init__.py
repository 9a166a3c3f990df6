"""The local Home Assistant with the simulated farm: installed, configured and supervised for the demo and the test suite."""
