"""One widget per pane.  Widgets only render what a snapshot says; they never touch the engine."""
