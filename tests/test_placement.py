from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from orleanspy.errors import SiloUnavailableError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.placement import (
    DEFAULT_PLACEMENT,
    HashBasedPlacement,
    PlacementStrategy,
    PreferLocalPlacement,
    RandomPlacement,
    choose_silo,
)

SILOS = [SiloAddress("10.0.0.1", 11111 + i, 7) for i in range(3)]
OUTSIDER = SiloAddress("10.0.0.9", 11111, 7)
GRAINS = [GrainId("Counter", i) for i in range(30_000)]


def shares(
    strategy: PlacementStrategy, local: SiloAddress | None = None
) -> dict[SiloAddress, float]:
    counts = Counter(strategy.choose(g, local, SILOS) for g in GRAINS)
    return {s: counts[s] / len(GRAINS) for s in SILOS}


def test_default_is_random() -> None:
    assert isinstance(DEFAULT_PLACEMENT, RandomPlacement)


@pytest.mark.parametrize("rng", [random.Random(42), None], ids=["seeded", "module-rng"])
def test_random_spreads_grains_fairly(rng: random.Random | None) -> None:
    # Binomial std of one share here is ~0.3 %; 2 % is far outside chance.
    for share in shares(RandomPlacement(rng)).values():
        assert share == pytest.approx(1 / 3, abs=0.02)


def test_random_with_same_seed_repeats() -> None:
    first = [RandomPlacement(random.Random(7)).choose(g, None, SILOS) for g in GRAINS[:50]]
    again = [RandomPlacement(random.Random(7)).choose(g, None, SILOS) for g in GRAINS[:50]]
    assert first == again


def test_prefer_local_picks_local_when_it_hosts_the_type() -> None:
    local = SILOS[1]
    assert shares(PreferLocalPlacement(), local)[local] == 1.0


def test_prefer_local_falls_back_to_random_when_local_does_not_host() -> None:
    for local in (OUTSIDER, None):
        result = shares(PreferLocalPlacement(RandomPlacement(random.Random(1))), local)
        for share in result.values():
            assert share == pytest.approx(1 / 3, abs=0.02)


def test_hash_based_is_the_documented_formula_and_stable() -> None:
    strategy = HashBasedPlacement()
    for g in GRAINS[:200]:
        chosen = strategy.choose(g, SILOS[0], SILOS)
        assert chosen == SILOS[g.uniform_hash() % 3]
        assert strategy.choose(g, SILOS[2], SILOS) == chosen  # local does not matter
    for share in shares(strategy).values():
        assert share == pytest.approx(1 / 3, abs=0.02)


def test_hash_based_agrees_with_another_process() -> None:
    grains = [GrainId("Counter", "alice"), GrainId("Counter", 12345), GrainId("Other", "x")]
    code = (
        "from orleanspy.identity import GrainId, SiloAddress\n"
        "from orleanspy.placement import HashBasedPlacement\n"
        "silos = [SiloAddress('10.0.0.1', 11111 + i, 7) for i in range(3)]\n"
        "grains = [GrainId('Counter', 'alice'), GrainId('Counter', 12345), GrainId('Other', 'x')]\n"
        "print(' '.join(str(HashBasedPlacement().choose(g, None, silos)) for g in grains))\n"
    )
    # A different PYTHONHASHSEED proves the choice does not lean on the salted hash().
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    here = " ".join(str(HashBasedPlacement().choose(g, None, SILOS)) for g in grains)
    assert out.stdout.strip() == here


@pytest.mark.parametrize(
    "strategy", [RandomPlacement(), PreferLocalPlacement(), HashBasedPlacement()]
)
def test_no_silos_is_silo_unavailable(strategy: PlacementStrategy) -> None:
    with pytest.raises(SiloUnavailableError, match="Counter"):
        strategy.choose(GrainId("Counter", 1), SILOS[0], [])


def test_choose_silo_uses_the_given_strategy_or_the_default() -> None:
    g = GrainId("Counter", 1)
    assert choose_silo(g, None, SILOS, HashBasedPlacement()) == SILOS[g.uniform_hash() % 3]
    assert choose_silo(g, None, SILOS) in SILOS
    with pytest.raises(SiloUnavailableError):
        choose_silo(g, None, [])


def test_strategies_are_frozen_values() -> None:
    assert HashBasedPlacement() == HashBasedPlacement()
    assert RandomPlacement(random.Random(1)) == RandomPlacement()
    assert hash(PreferLocalPlacement()) == hash(PreferLocalPlacement())
    with pytest.raises(AttributeError):
        RandomPlacement().rng = None  # type: ignore[misc]
