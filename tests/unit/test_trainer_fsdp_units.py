"""Which submodules FSDP shards on their own in a model without a parallelize plan."""

from __future__ import annotations

import pytest
from torch import nn

from phalanx_trainer.parallelize import default_fsdp_units

pytestmark = pytest.mark.unit


def test_repeated_blocks_are_the_units() -> None:
    model = nn.Module()
    model.embed = nn.Embedding(10, 4)
    model.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
    model.head = nn.Linear(4, 10)
    assert default_fsdp_units(model) == list(reversed(model.blocks))


def test_without_blocks_each_child_holding_parameters_is_a_unit() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    # nn.Sequential is no ModuleList: its children holding parameters, not the activation
    assert {id(unit) for unit in default_fsdp_units(model)} == {id(model[0]), id(model[2])}


def test_a_unit_sharing_a_parameter_with_the_rest_stays_with_the_root() -> None:
    model = nn.Module()
    model.embed = nn.Embedding(10, 4)
    model.head = nn.Linear(4, 10, bias=False)
    model.head.weight = model.embed.weight  # tied
    model.body = nn.Linear(4, 4)
    assert default_fsdp_units(model) == [model.body]


def test_nested_blocks_come_innermost_first() -> None:
    inner = nn.ModuleList([nn.Linear(2, 2)])
    outer_block = nn.Module()
    outer_block.inner = inner
    model = nn.Module()
    model.blocks = nn.ModuleList([outer_block])
    units = default_fsdp_units(model)
    assert units.index(inner[0]) < units.index(outer_block)
