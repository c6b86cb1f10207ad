"""The built-in harness presets, one module per agent CLI."""
