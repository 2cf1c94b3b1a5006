"""Imported by probe.py from the script's own folder (sys.path[0])."""

VALUE = "sibling imported"
