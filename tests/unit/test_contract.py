"""Operator and trainer agree on the environment contract without importing each other."""

from __future__ import annotations

import pytest

from phalanx import constants as operator_side
from phalanx_trainer import contract as trainer_side

pytestmark = pytest.mark.unit

SHARED = [
    name
    for name in dir(trainer_side)
    if name.startswith(("ENV_", "EXIT_", "DEFAULT_METRICS", "DEFAULT_CONTROL"))
]


@pytest.mark.parametrize("name", [n for n in SHARED if hasattr(operator_side, n)])
def test_names_match_on_both_sides(name: str) -> None:
    assert getattr(operator_side, name) == getattr(trainer_side, name)


def test_every_operator_env_name_the_trainer_reads_exists_on_the_operator_side() -> None:
    trainer_only = {"ENV_RANK", "ENV_LOCAL_RANK"}  # set per process by the launcher, never by the operator
    missing = [
        n for n in SHARED if n.startswith("ENV_") and n not in trainer_only and not hasattr(operator_side, n)
    ]
    assert missing == []


def test_preemption_exit_code_is_a_plain_exit_not_a_signal() -> None:
    assert 0 < operator_side.EXIT_CHECKPOINTED_ON_PREEMPTION < operator_side.FIRST_SIGNAL_EXIT_CODE


def test_the_environment_doc_lists_every_contract_variable() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "environment.md").read_text()
    for name in operator_side.RESERVED_ENV_NAMES:
        if name not in ("RANK", "LOCAL_RANK"):
            assert f"`{name}`" in doc, name
