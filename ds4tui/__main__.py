from ds4tui.cli import program

program()
