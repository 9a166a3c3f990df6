"""Everything that touches Home Assistant or the farm's screens."""
