"""The operator's controllers, one folder each (controllers/loop.py says what a unit is): the unit
(unit.py), its reconcile and its pure rules. A unit never imports another unit's modules
(tests/unit/controllers/test_units_apart.py); what they share lives at controllers/'s root."""
