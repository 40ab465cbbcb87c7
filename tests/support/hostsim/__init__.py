"""Host simulators for tests (never shipped): `fakehost` builds host roots from the YAML fixtures
in tests/fixtures/hosts; `kernelsim` gives sysfs writes their kernel meaning; both write through
the primitives in `sysfs` (so neither imports the other's internals)."""
