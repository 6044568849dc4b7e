"""An application module whose import fails, for the command line's load errors."""

raise RuntimeError("the settings file is missing")
