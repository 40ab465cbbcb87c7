"""Host simulators for tests (never shipped): `fakehost` builds host roots from the YAML fixtures
in tests/fixtures/hosts (with the simulator's builder, gpu_operator.sim.hardware.hosttree); `kernelsim`
gives sysfs writes their kernel meaning, writing through the same primitives."""
