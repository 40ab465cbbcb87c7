"""`sim up` says which components its stand-ins play: every node stand-in the module lists, not an
older subset (the line once named five of nine, leaving out the toolkit, virt-handler and our
node agents)."""

from __future__ import annotations

import re

from gpu_operator.sim.standins import roster

# listed in the module's docstring but not a stand-in of its own: NFD's master has its own flag and
# phrase, CRI-O's writes are the container toolkit's, the compute-domains container is the DRA plugin's
NOT_THEIR_OWN = {
    "sim/standins/nfdmaster.py",
    "sim/standins/toolkitcrio.py",
    "sim/standins/computedomainplugin.py",
}


def test_the_line_names_every_node_stand_in_the_module_lists() -> None:
    listed = set(re.findall(r"`(sim/[a-z_/]+\.py)`", roster.__doc__ or "")) - NOT_THEIR_OWN
    assert listed == set(roster.PLAYED)
    line = roster.played()
    assert [name for name in roster.PLAYED.values() if name not in line] == []
