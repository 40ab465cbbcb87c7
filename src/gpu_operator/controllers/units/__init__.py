"""The operator's controllers, one unit each (controllers/loop.py says what a unit is)."""
