"""`farmhost demo`: the one-command local demo (a real Home Assistant farm, farmhost in-process, a terminal chat).

Modules: `ha` (the local Home Assistant, through the test suite's harness), `simulator` (a compressed farm day
driving HA's helpers), `host` (farmhost in-process: settings, the local main group, dashboard and screenshot
through IPC), `console` (the terminal chat standing in for Telegram), `text` (what the demo prints), `runner`
(the order of it all, signals and the clean stop) and `cli` (the `farmhost demo` argument parser).
See docs/demo.md.
"""
