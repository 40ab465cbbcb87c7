"""The operator's controllers, one folder each (controllers/loop.py says what a unit is): the unit
(unit.py), its reconcile and its pure rules. A unit never imports another unit's modules
(tests/unit/controllers/test_units_apart.py); what they share lives at controllers/'s root.

A unit that writes something an uninstall must take back (on Nodes, or objects no owner reference
takes away) says how in its folder's takeback.py (`take_back`, controllers/cleanup.py's `TakeBack`);
`take_backs()` is the one list of them, which `gpu-operator cleanup` (admin/cleanup.py) runs and
tests/unit/controllers/test_units_apart.py keeps equal to the folders holding one."""

from __future__ import annotations

from gpu_operator.controllers.cleanup import TakeBack


def take_backs() -> tuple[TakeBack, ...]:
    """Each unit's take-back step, in the order they run: the upgrade's cordons, then GPU health's
    and MIG's, while the annotations that say whose cordon it is are still there; node labelling's
    last, as it takes those annotations. Imported here, when called, so that importing one unit
    does not import the others."""
    from gpu_operator.controllers.units.health import takeback as health
    from gpu_operator.controllers.units.labels import takeback as labels
    from gpu_operator.controllers.units.mig import takeback as mig
    from gpu_operator.controllers.units.upgrade import takeback as upgrade

    return (upgrade.take_back, health.take_back, mig.take_back, labels.take_back)
