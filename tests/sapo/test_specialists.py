"""Specialist nodes: a node that draws its own questions from some families of the mix (``tasks.draw_families``,
``node_families``), and the sharing experiment's figures on the families a node never draws."""

from __future__ import annotations

import pytest

from swarmlm.config import ConfigError, validate_config
from swarmlm.experiments.sapo_sharing import ExperimentConfig, run_config
from swarmlm.sapo.config import SimulateConfig
from swarmlm.sapo.swarm.config import SwarmConfig
from swarmlm.tasks import TaskConfig, TaskSource, eval_questions
from swarmlm.tasks.provenance import is_stream_item

MIX = ["chain_sum", "basic_arithmetic", "products"]  # the default preset, in its order


def test_a_specialist_draws_only_its_families_and_its_questions_stay_verifiable():
    source = TaskSource(TaskConfig(draw_families=["products"]), stream="s/node-2")
    questions = [q for r in range(30) for q in source.sample(4, round=r)]
    assert {q.family for q in questions} == {"products"}
    # a receiver checks the question against the sender's stream for its family, whatever the sender draws
    assert all(is_stream_item(q.provenance, "s/node-2", r, slot)
               for r in range(30) for slot, q in enumerate(source.sample(4, round=r)))
    # a generalist of the same stream draws the other families too, and the same products where it draws them
    general = TaskSource(TaskConfig(), stream="s/node-2")
    assert {q.family for r in range(30) for q in general.sample(4, round=r)} == set(MIX)
    # the held-out set is every family's, for a specialist as for anyone
    assert [q.question for q in eval_questions(TaskConfig(draw_families=["products"], eval_size=30))] == \
        [q.question for q in eval_questions(TaskConfig(eval_size=30))]


def test_two_drawn_families_follow_their_weights():
    source = TaskSource(TaskConfig(draw_families=["chain_sum", "products"]), stream="s/n")
    families = [source.family_at(r, slot) for r in range(500) for slot in range(4)]
    assert set(families) == {"chain_sum", "products"}
    assert 0.45 < families.count("products") / len(families) < 0.55


def test_a_family_outside_the_mix_names_the_field_and_the_allowed_ones():
    with pytest.raises(ConfigError, match="draw_families.*'spell_backward'.*allowed: chain_sum, basic_arithmetic, products"):
        validate_config(SimulateConfig, {"tasks": {"draw_families": ["spell_backward"]}})
    with pytest.raises(ConfigError, match="node_families.*'chain_sum\\+bf'.*allowed: chain_sum, basic_arithmetic"):
        validate_config(SimulateConfig, {"node_families": ["products", "chain_sum+bf"]})


def test_node_families_give_each_node_its_own_draw_and_nothing_else():
    cfg = validate_config(SimulateConfig, {"nodes": 4, "node_families": "[chain_sum, products+basic_arithmetic]",
                                           "node_models": ["tiny-qwen2", "tiny-llama"]})
    assert [cfg.node_config(k).tasks.draw_families for k in range(4)] == [
        ["chain_sum"], ["products", "basic_arithmetic"], ["chain_sum"], ["products", "basic_arithmetic"]]
    assert [cfg.node_config(k).model.name for k in range(4)] == ["tiny-qwen2", "tiny-llama"] * 2
    node = cfg.node_config(1)
    assert node.tasks.model_dump(exclude={"draw_families"}) == cfg.tasks.model_dump(exclude={"draw_families"})
    assert SimulateConfig().node_config(0) == SimulateConfig()  # without node options a node is the run


def test_the_swarm_launcher_gives_each_node_process_its_families(tmp_path):
    from swarmlm.sapo.swarm.launcher import node_configs

    cfg = validate_config(SwarmConfig, {"nodes": 3, "node_families": ["products", "chain_sum"], "out": str(tmp_path)})
    assert [c.tasks.draw_families for c in node_configs(cfg)] == [["products"], ["chain_sum"], ["products"]]


def test_specialists_scenario_makes_node_k_draw_family_k():
    cfg = ExperimentConfig(scenario="specialists", nodes=4, seeds=[0])
    run = run_config(cfg, "4/4", 0)
    assert run.node_families == MIX
    assert [run.node_config(k).tasks.draw_families for k in range(4)] == [[f] for f in MIX + MIX[:1]]
    assert run_config(ExperimentConfig(), "4/4", 0).node_families == []  # homogeneous: everyone draws the whole mix
    assert run_config(ExperimentConfig(scenario="specialists", node_families=["products"]), "4/4", 0).node_families == ["products"]


def test_a_specialists_warm_start_is_the_whole_mix_s(monkeypatch):
    from swarmlm.sapo import node as node_module

    seen = []
    monkeypatch.setattr(node_module, "warmstart", lambda ws, progress=True: seen.append(ws) or "/cache/ws")
    cfg = validate_config(SimulateConfig, {"nodes": 2, "node_families": ["products", "chain_sum"]})
    assert node_module.initial_model_path(cfg.node_config(0)) == "/cache/ws"
    assert seen[0].tasks.draw_families == [] and seen[0].tasks.resolved_families() == cfg.tasks.resolved_families()


def test_the_default_warm_starts_cache_key_is_unchanged():
    from swarmlm.sapo.warmstart import WarmstartConfig, warmstart_key

    # the key of the seed-0 warm start before draw_families existed (the default until the seed-1 one shipped): its
    # caches and committed figures still hold
    assert warmstart_key(WarmstartConfig(seed=0)) == "70d55286f06646d3"
    assert warmstart_key(WarmstartConfig(seed=0, tasks={"draw_families": ["products"]})) != "70d55286f06646d3"


def _node(own_start, own_end, unseen_start, unseen_end):
    """A node of a 3-family mix drawing ``chain_sum``: per-family pass@1 at round 0 and at the end."""
    def row(r, own, unseen):
        by = {"chain_sum": own, "basic_arithmetic": unseen[0], "products": unseen[1]}
        return {"round": r, "eval_pass1": (own + sum(unseen)) / 3, "eval_by_family": by}
    return [row(0, own_start, unseen_start), {"round": 1, "reward_own": 0.5, "external_used": 2, "external_weight": 0.5,
                                         "external_loss_share": 0.25},
            {"round": 2, "reward_own": 0.5, "external_used": 4, **row(2, own_end, unseen_end)}]


def test_specialist_figures_match_hand_computation():
    from swarmlm.experiments.sapo_sharing_report import specialist_numbers, specialist_table

    cfg = ExperimentConfig(configurations=["2/0", "1/1"], seeds=[0, 1], nodes=2, rounds=2,
                           node_families=["chain_sum", "chain_sum"])
    a = _node(0.5, 0.7, (0.2, 0.4), (0.2, 0.6))
    b = _node(0.3, 0.3, (0.0, 0.2), (0.4, 0.4))
    got = specialist_numbers(cfg, [a, b])
    assert got["pass1_unseen_start"] == pytest.approx((0.3 + 0.1) / 2)
    assert got["pass1_unseen_end"] == pytest.approx((0.4 + 0.4) / 2)
    assert got["pass1_own_start"] == pytest.approx(0.4) and got["pass1_own_end"] == pytest.approx(0.5)
    assert got["pass1_all_start"] == pytest.approx(((0.5 + 0.6) / 3 + (0.3 + 0.2) / 3) / 2)
    assert got["external_used_per_round"] == pytest.approx(3.0) and got["external_weight_mean"] == pytest.approx(0.5)
    assert got["external_loss_share_mean"] == pytest.approx(0.25)
    # by family: both nodes draw chain_sum; basic_arithmetic and products are the others'
    assert got["family:chain_sum:drawn_end"] == pytest.approx(0.5) and "family:chain_sum:others_end" not in got
    assert got["family:products:others_start"] == pytest.approx(0.3)
    assert got["family:products:others_end"] == pytest.approx(0.5)
    low = _node(0.5, 0.5, (0.2, 0.4), (0.2, 0.4))
    runs = {("2/0", 0): [low, low], ("2/0", 1): [low, low], ("1/1", 0): [a, b], ("1/1", 1): [b, a]}
    table = specialist_table(cfg, runs)["configurations"]
    # unseen at the end: 0.3 in the baseline, 0.4 with sharing in both seeds: +0.1 paired, no spread
    assert table["1/1"]["pass1_unseen_end_vs_baseline"]["mean"] == pytest.approx(0.1)
    assert table["1/1"]["pass1_unseen_end_vs_baseline"]["ci95"] == pytest.approx(0.0, abs=1e-12)
    assert table["2/0"]["pass1_unseen_end_vs_baseline"] is None
    assert table["1/1"]["pass1_unseen_gain"]["mean"] == pytest.approx(0.4 - 0.2)
    assert table["2/0"]["pass1_unseen_gain"]["mean"] == pytest.approx(0.0)


# Experts: nodes that know different things at round 0 (node k's warm start learns only its families), each drawing
# from the whole mix.


def test_experts_scenario_warm_starts_node_k_on_family_k_alone_and_lets_it_draw_everything():
    run = run_config(ExperimentConfig(scenario="experts", nodes=4, seeds=[0]), "4/4", 0)
    assert run.node_warmstart_families == MIX and run.node_families == []
    assert [run.node_config(k).model.warmstart_families for k in range(4)] == [[f] for f in MIX + MIX[:1]]
    assert all(run.node_config(k).tasks.draw_families == [] for k in range(4))
    assert [run.node_specialty(k) for k in range(4)] == [[f] for f in MIX + MIX[:1]]
    assert run.node_label(2) == "tiny-qwen2 (warm start: products)"
    assert SimulateConfig().node_specialty(0) == [] and SimulateConfig().node_label(0) == "tiny-qwen2"


def test_each_experts_warm_start_learns_its_families_and_is_made_once(monkeypatch):
    from swarmlm.sapo import node as node_module

    seen = []
    monkeypatch.setattr(node_module, "warmstart",
                        lambda ws, progress=True: seen.append(ws) or f"/cache/{'+'.join(ws.tasks.draw_families)}")
    cfg = validate_config(SimulateConfig, {"nodes": 4, "node_warmstart_families": ["products", "chain_sum+basic_arithmetic"]})
    paths = node_module.initial_model_paths([cfg.node_config(k) for k in range(4)])
    assert paths == ["/cache/products", "/cache/chain_sum+basic_arithmetic"] * 2
    assert [ws.tasks.draw_families for ws in seen] == [["products"], ["chain_sum", "basic_arithmetic"]]  # once each
    # an expert's warm start has a cache key of its own; the whole mix's stays the default's
    from swarmlm.sapo.warmstart import WarmstartConfig, warmstart_key

    assert len({warmstart_key(ws) for ws in seen} | {warmstart_key(WarmstartConfig())}) == 3


def test_warm_start_families_outside_the_mix_name_the_field_and_the_allowed_ones():
    with pytest.raises(ConfigError, match="model.warmstart_families.*'spell_backward'.*allowed: chain_sum, basic_arithmetic"):
        validate_config(SimulateConfig, {"model": {"warmstart_families": "[spell_backward]"}})
    with pytest.raises(ConfigError, match="node_warmstart_families.*'products\\+x'.*allowed: chain_sum"):
        validate_config(SimulateConfig, {"node_warmstart_families": ["chain_sum", "products+x"]})
    # a single node takes it as a model option
    assert validate_config(SimulateConfig, {"model": {"warmstart_families": "[products]"}}).node_config(1).model.warmstart_families == ["products"]


def test_the_swarm_launcher_gives_each_node_process_its_warm_start_families(tmp_path):
    from swarmlm.sapo.swarm.launcher import node_configs

    cfg = validate_config(SwarmConfig, {"nodes": 3, "node_warmstart_families": ["products", "chain_sum"], "out": str(tmp_path)})
    assert [c.model.warmstart_families for c in node_configs(cfg)] == [["products"], ["chain_sum"], ["products"]]
    assert [c.tasks.draw_families for c in node_configs(cfg)] == [[], [], []]


def test_expert_figures_take_a_nodes_own_families_from_its_warm_start():
    from swarmlm.experiments.sapo_sharing_report import _family_lines, _specialist_lines, specialist_numbers, specialist_table

    cfg = ExperimentConfig(configurations=["2/0", "1/1"], seeds=[0], nodes=2, rounds=2, scenario="experts",
                           node_warmstart_families=["chain_sum", "chain_sum"])
    a = _node(0.5, 0.7, (0.2, 0.4), (0.2, 0.6))
    got = specialist_numbers(cfg, [a, a])
    assert got["pass1_own_end"] == pytest.approx(0.7) and got["pass1_unseen_end"] == pytest.approx(0.4)
    assert got["family:chain_sum:drawn_end"] == pytest.approx(0.7) and got["family:products:others_end"] == pytest.approx(0.6)
    results = {"specialists": specialist_table(cfg, {("2/0", 0): [a, a], ("1/1", 0): [a, a]})}
    assert results["specialists"]["set_apart_by"] == "warm start"
    text = "\n".join(_specialist_lines(results) + _family_lines(cfg, results))
    assert "Experts: every node draws from the whole mix" in text and "outside a node's warm start" in text
    assert "| its experts: start |" in text and "Specialists" not in text
