"""The verifier: scores through bounded worker processes, regenerates peers' questions, never executes text,
drops what overruns, and leaves no process behind."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from swarmlm.config import validate_config
from swarmlm.tasks import TASK_PRESETS, TaskConfig, TaskSource
from swarmlm.tasks.provenance import EVAL_SEED, STREAM_STRIDE, TRAIN_SEED, Provenance, config_digest
from swarmlm.verify.scorer_audit import allowed_families
from swarmlm.verify.verifier import ScoreRequest, Verifier, score_in_process

REPO = Path(__file__).resolve().parents[2]
from tests.verify.test_safe_scorers import _hostile_entries, _one_item, canary_payloads  # noqa: E402


def _config(**data) -> TaskConfig:
    return validate_config(TaskConfig, data)


def _both_presets() -> TaskConfig:
    """The paper mix, plus the easy mix's other families (basic_arithmetic keeps the paper's config)."""
    paper = {f.name for f in TASK_PRESETS["paper"]}
    extra = [{"name": f.name, "config": f.config} for f in TASK_PRESETS["easy"] if f.name not in paper]
    return _config(preset="paper", allow_families=extra, verifier={"workers": 2})


@pytest.fixture(scope="module")
def verifier():
    with Verifier(_both_presets()) as v:
        v.wait_ready()
        yield v


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------- scoring and regeneration
@pytest.mark.parametrize("preset", ["easy", "paper"])
def test_pool_scores_equal_in_process_scores_and_regeneration_reproduces_the_streams(verifier, preset):
    config = _config(preset=preset)
    source = TaskSource(config, stream="test/4242")
    questions = source.sample(40, round=0)
    own, peer = [], []
    for q in questions:
        answers = [q.answer, "wrong", None, "", "0", (q.answer or "") + " ", q.metadata.get("example_answer")]
        own.append(ScoreRequest(q.family, answers, entry=q.entry))
        peer.append(ScoreRequest(q.family, answers, provenance=q.provenance, question=q.question))
    if preset == "easy":  # basic_arithmetic's easy config is not the verifier's: foreign_config for peers
        verifier_families = verifier.families
        assert verifier_families["basic_arithmetic"] != dict(TASK_PRESETS["easy"][1].config)
    results = verifier.score_many(own + peer)
    for q, req, res in zip(questions + questions, own + peer, results):
        expected = [score_in_process(source, q.family, a, q.entry) for a in req.answers]
        if req.provenance is not None and verifier.digests.get(q.family) != q.provenance.config:
            assert res.drop == "foreign_config"
            continue
        assert res.ok, (q.family, res.drop, res.detail)
        assert res.scores == pytest.approx(expected), q.family
        if req.provenance is not None:
            assert res.item.question == q.question and res.item.answer == q.answer
            assert res.item.metadata == json.loads(json.dumps(q.metadata))


def test_score_completions_scores_the_answer_span_of_each_text(verifier):
    """Completion texts of own questions: only the <answer> span is scored, as the answer it holds would be; a text
    without one scores as no answer."""
    from swarmlm.tasks import format_answer

    source = TaskSource(_config(preset="paper"), stream="test/77")
    questions = [q for q in source.sample(10, round=0) if q.answer][:4]
    texts = [[format_answer(q.answer), "no tags, just " + q.answer, format_answer("surely wrong"),
              "reasoning first " + format_answer(q.answer)] for q in questions]
    results = verifier.score_completions(questions, texts)
    for q, res in zip(questions, results):
        assert res.ok, (q.family, res.drop)
        expected = [score_in_process(source, q.family, a, q.entry) for a in (q.answer, None, "surely wrong", q.answer)]
        assert res.scores == pytest.approx(expected) and res.scores[0] == 1.0 and res.scores[1] < 1.0, q.family
    assert verifier.completion_scores(questions, texts) == [r.scores for r in results]
    unscored = verifier.score_many([ScoreRequest("countdown", ["1"], entry={"question": "", "answer": "1", "metadata": {}})])[0]
    assert not unscored.ok and unscored.scores_or_zeros(3) == [0.0, 0.0, 0.0]


def test_scores_or_zeros_replaces_non_finite_scores():
    from swarmlm.verify.verifier import ScoreResult

    assert ScoreResult(scores=[1.0, float("nan"), float("inf"), 0.5]).scores_or_zeros(4) == [1.0, 0.0, 0.0, 0.5]


def test_regenerate_returns_the_receivers_own_item(verifier):
    source = TaskSource(TaskConfig(preset="paper"), stream="test/99")
    questions = source.sample(12, round=0)
    regenerated = verifier.regenerate([q.provenance for q in questions])
    for q, r in zip(questions, regenerated):
        assert r.drop == "" and r.item.question == q.question and r.item.answer == q.answer
    again = verifier.regenerate([q.provenance for q in questions])  # from the item cache
    assert [r.item.question for r in again] == [q.question for q in questions]


def test_peer_provenance_is_checked_before_anything_runs(verifier):
    source = TaskSource(TaskConfig(preset="paper"), stream="test/5")
    q = next(q for q in source.sample(20, round=0) if q.family == "binary_matrix")
    p = q.provenance
    cases = {
        "forged_task": ScoreRequest(q.family, ["x"], provenance=p, question=q.question + " (now answer 42)"),
        "foreign_config": ScoreRequest(q.family, ["x"], provenance=Provenance(p.family, p.seed, p.index,
                                       config_digest("binary_matrix", {"max_n": 11}))),
        "foreign_family": ScoreRequest("rubiks_cube", ["R1000000"], provenance=Provenance("rubiks_cube", p.seed, 0, "0" * 32)),
        "bad_provenance": ScoreRequest(q.family, ["x"], provenance=Provenance(p.family, p.seed + 1, p.index, p.config)),
    }
    results = verifier.score_many(list(cases.values()))
    assert [r.drop for r in results] == list(cases)
    bad = [Provenance(p.family, EVAL_SEED, 0, p.config), Provenance(p.family, -STREAM_STRIDE, 0, p.config),
           Provenance(p.family, 2 * STREAM_STRIDE, 0, p.config), Provenance(p.family, 0, 0, p.config),
           Provenance(p.family, p.seed, STREAM_STRIDE, p.config), Provenance(p.family, p.seed, -1, p.config)]
    assert [r.drop for r in verifier.regenerate(bad)] == ["bad_provenance"] * 6
    own_foreign = verifier.score_many([ScoreRequest("countdown", ["1"], entry={"question": "", "answer": "1", "metadata": {}})])
    assert own_foreign[0].drop == "foreign_family"


def test_a_peer_cannot_pair_a_question_with_another_answer(verifier):
    """Reward poisoning: question i sent with the answer of question j, and completions that agree with j."""
    source = TaskSource(TaskConfig(preset="paper"), stream="test/8")
    qs = [q for q in source.sample(30, round=0) if q.answer]
    i, j = next((a, b) for a in qs for b in qs if a.family == b.family and a.answer != b.answer)
    poisoned = ScoreRequest(i.family, [j.answer] * 4 + [i.answer], provenance=i.provenance, question=i.question)
    result = verifier.score_many([poisoned])[0]
    assert result.ok and max(result.scores[:4]) < 1.0 and result.scores[4] == 1.0


# ----------------------------------------------------------------------------- canaries through the pool
@pytest.fixture(scope="module")
def all_families_verifier():
    families = allowed_families()
    config = _config(families=[{"name": families[0]}], allow_families=[{"name": n} for n in families[1:]],
                     verifier={"workers": 2})
    with Verifier(config) as v:
        v.wait_ready()
        yield v


def test_canaries_never_execute_through_the_pool(all_families_verifier, tmp_path):
    v = all_families_verifier
    canary = tmp_path / "CANARY_POOL"
    payloads = canary_payloads(canary)
    requests = []
    for family in v.families:
        _, item = _one_item(family)
        for payload in payloads:
            requests.append(ScoreRequest(family, [payload, item["answer"]], entry=item))
            for entry in _hostile_entries(item, payload):
                requests.append(ScoreRequest(family, [payload, "1"], entry=entry))
    pids = v.pool.worker_pids()
    results = v.score_many(requests)
    assert len(results) == len(requests) > 5000
    assert not canary.exists() and not Path("CANARY").exists()
    assert v.pool.worker_pids() == pids and v.pool.restarts == 0  # no payload killed a worker
    assert sum(r.ok for r in results) == len(results)


def _score_or_zero(scorer, ds, answer, entry) -> float:
    try:
        return float(scorer(ds, answer, entry))
    except Exception:  # the verifier's rule: an answer the scorer raises on scores 0 (e.g. int("wrong"))
        return 0.0


def test_every_allowed_family_regenerates_and_scores_in_the_pool_as_in_this_process(all_families_verifier):
    """Items are a pure function of (family, config, seed, index) in another process too (no hidden global
    state), and the worker's audit hook and limits do not change an honest score."""
    import reasoning_gym

    from swarmlm.tasks.provenance import DATASET_SIZE
    from swarmlm.verify.safe_scorers import scorer_for

    v = all_families_verifier
    seed, index = TRAIN_SEED, 3
    provenances = [Provenance(f, seed, index, v.digests[f]) for f in v.families]
    regenerated = v.regenerate(provenances)
    requests, expected = [], []
    for prov, result in zip(provenances, regenerated):
        assert result.drop == "", (prov.family, result.detail)
        ds = reasoning_gym.create_dataset(prov.family, seed=seed, size=DATASET_SIZE)
        local = json.loads(json.dumps(ds[index]))
        assert result.item.entry == {k: local.get(k) for k in ("question", "answer", "metadata")}, prov.family
        answers = [local["answer"], "wrong", None, "0", (local["answer"] or "")[:3]]
        requests.append(ScoreRequest(prov.family, answers, provenance=prov, question=local["question"]))
        expected.append([_score_or_zero(scorer_for(prov.family), ds, a, local) for a in answers])
    for req, res, exp in zip(requests, v.score_many(requests), expected):
        assert res.ok and res.scores == pytest.approx(exp), req.family


_DIGEST_ITEMS = textwrap.dedent("""
    import hashlib, json, os, sys
    sys.stdout = open(os.devnull, "w")
    import reasoning_gym
    from swarmlm.tasks.provenance import DATASET_SIZE, TRAIN_SEED
    from swarmlm.verify.scorer_audit import allowed_families
    out = {}
    for family in allowed_families():
        ds = reasoning_gym.create_dataset(family, seed=TRAIN_SEED, size=DATASET_SIZE)
        blob = json.dumps([ds[i] for i in (0, 1, 2, 50)], sort_keys=True, default=repr)
        out[family] = hashlib.sha256(blob.encode()).hexdigest()
    sys.stderr.write(json.dumps(out) + "\\n")
""")


def test_every_allowed_familys_items_are_the_same_in_any_process():
    """Provenance needs items to be a pure function of (family, config, seed, index): not of the process's
    string-hash seed (isomorphic_strings, ransom_note and knight_swap depend on it, and are refused)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    runs = [subprocess.Popen([sys.executable, "-c", _DIGEST_ITEMS], stderr=subprocess.PIPE, text=True,
                             env=dict(env, PYTHONHASHSEED=str(seed))) for seed in (1, 2)]
    digests = [json.loads(run.communicate(timeout=600)[1].strip().splitlines()[-1]) for run in runs]
    assert set(digests[0]) == set(allowed_families())
    assert [f for f in digests[0] if digests[0][f] != digests[1][f]] == []


def test_the_audit_hook_stops_evaluation_even_in_an_evaluating_scorer(tmp_path):
    """Defence in depth: a worker refuses compile/exec/open while scoring, so even reasoning-gym's own
    binary_matrix scorer (eval) would not run a payload there."""
    code = textwrap.dedent(f"""
        import json, sys
        from swarmlm.verify import scoring_worker
        worker = scoring_worker.Worker({{"binary_matrix": {{}}}}, 5.0)
        scoring_worker.sys.addaudithook(scoring_worker._audit_hook)
        ds = worker.scoring_datasets["binary_matrix"]
        worker.scorers["binary_matrix"] = lambda d, a, e: type(d).score_answer(d, a, e)
        payload = "__import__('pathlib').Path({str(tmp_path / 'CANARY_HOOK')!r}).touch()"
        print(json.dumps(worker.handle({{"op": "score", "family": "binary_matrix",
              "entry": {{"question": "", "answer": "0", "metadata": {{}}}}, "answers": [payload, "0"]}})))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["scores"] == [0.0, 1.0]
    assert not (tmp_path / "CANARY_HOOK").exists()


# ----------------------------------------------------------------------------- limits
def _slow_config(n: int, **verifier) -> TaskConfig:
    """binary_matrix items of size n x n: generation is O(n^2) in Python (n = 1000: ~5 s of CPU)."""
    return _config(families=[{"name": "binary_matrix", "config": {"min_n": n, "max_n": n}}, {"name": "chain_sum"}],
                   verifier=dict({"workers": 1}, **verifier))


def _provenance(config: TaskConfig, family: str, index: int = 0) -> Provenance:
    spec = next(f for f in config.resolved_families() if f.name == family)
    return Provenance(family, TRAIN_SEED, index, config_digest(family, spec.config))


def test_an_overrun_is_dropped_as_scorer_timeout_and_the_batch_goes_on():
    config = _slow_config(1000, generate_cpu_seconds=0.5, wall_seconds=60)
    with Verifier(config) as v:
        chain = ScoreRequest("chain_sum", ["3", "4"], entry={"question": "1+2", "answer": "3", "metadata": {}})
        slow = ScoreRequest("binary_matrix", ["x"], provenance=_provenance(config, "binary_matrix"))
        started = time.monotonic()
        results = v.score_many([chain, slow, chain, chain])
        assert [r.drop for r in results] == ["", "scorer_timeout", "", ""]
        assert results[0].scores == [1.0, 0.0] and results[3].scores == [1.0, 0.0]
        assert v.pool.restarts == 1
        assert v.score_many([chain])[0].scores == [1.0, 0.0]  # the replacement worker serves
        assert time.monotonic() - started < 120


def test_the_wall_clock_deadline_kills_a_job_that_is_not_using_cpu_fast_enough():
    config = _slow_config(1000, generate_cpu_seconds=60, wall_seconds=0.5)
    with Verifier(config) as v:
        v.wait_ready()
        result = v.regenerate([_provenance(config, "binary_matrix")])[0]
        assert result.drop == "scorer_timeout" and "s" in result.detail


def test_a_job_over_the_memory_limit_is_dropped_as_scorer_memory():
    config = _slow_config(6000, generate_cpu_seconds=120, wall_seconds=300, memory_mb=64)
    with Verifier(config) as v:
        assert v.regenerate([_provenance(config, "binary_matrix")])[0].drop == "scorer_memory"
        chain = ScoreRequest("chain_sum", ["3"], entry={"question": "1+2", "answer": "3", "metadata": {}})
        assert v.score_many([chain])[0].scores == [1.0]


def test_a_dataset_config_reasoning_gym_rejects_is_a_config_error():
    from swarmlm.config import ConfigError

    with pytest.raises(ConfigError, match="family 'binary_matrix' is invalid: AssertionError: min_n must be at least 1"):
        Verifier(_config(families=[{"name": "binary_matrix", "config": {"min_n": 0}}]))


# ----------------------------------------------------------------------------- process lifecycle
_PARENT = textwrap.dedent("""
    import faulthandler, os, signal, sys, time
    faulthandler.register(signal.SIGUSR1)  # the test asks for the stacks of a parent that does not exit
    # Ctrl+C as a terminal delivers it: the test process may have SIGINT ignored or blocked by then (an ignored or
    # blocked signal is inherited across exec, and one such parent sat in its loop, SIGINT never raised)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from swarmlm.tasks import TaskConfig
    from swarmlm.verify.verifier import ScoreRequest, Verifier
    v = Verifier(TaskConfig())
    v.wait_ready()
    print(" ".join(map(str, v.pool.worker_pids())), flush=True)
    mode = sys.argv[1]
    if mode == "exception":
        raise RuntimeError("the node crashed")
    if mode == "exit":
        sys.exit(0)
    while True:  # wait for SIGINT / SIGKILL
        v.score_many([ScoreRequest("chain_sum", ["3"], entry={"question": "", "answer": "3", "metadata": {}})])
        time.sleep(0.05)
""")


@pytest.mark.parametrize("mode", ["exception", "sigint", "sigkill"])
def test_no_worker_outlives_its_parent(mode):
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids), parent.stderr.read()[-2000:]
    if mode == "sigint":
        time.sleep(0.3)
        parent.send_signal(signal.SIGINT)  # Ctrl+C: KeyboardInterrupt in the parent
    elif mode == "sigkill":
        parent.kill()  # a crash that runs no Python cleanup at all
    try:
        parent.wait(timeout=60)
    except subprocess.TimeoutExpired:  # say where it hangs before failing
        parent.send_signal(signal.SIGUSR1)
        time.sleep(2)
        parent.kill()
        pytest.fail(f"the parent did not exit after {mode}; its stacks:\n{parent.communicate()[1][-6000:]}")
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), mode


def _score_in_child(queue) -> None:
    from swarmlm.verify.verifier import ScoreRequest, Verifier

    with Verifier(TaskConfig()) as v:
        result = v.score_many([ScoreRequest("products", ["12", "13"], entry={"question": "3*4", "answer": "12", "metadata": {}})])
        queue.put(result[0].scores)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_works_in_a_daemonic_multiprocessing_child(method):
    """Nodes may run as multiprocessing (or torchrun) children, even daemonic ones, which may not use
    multiprocessing themselves: the pool starts its workers with subprocess."""
    ctx = multiprocessing.get_context(method)
    queue = ctx.Queue()
    child = ctx.Process(target=_score_in_child, args=(queue,), daemon=True)
    child.start()
    try:
        assert queue.get(timeout=300) == [1.0, 0.0]
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0


def test_the_cost_benchmark_runs_and_writes_its_numbers(tmp_path):
    out = tmp_path / "cost.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "verifier_cost.py"), "--presets", "easy",
                          "--rounds", "3", "--workers", "1", "--out", str(out)], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    (easy,) = report["runs"]
    assert easy["answers_per_round"] == 128 and easy["drops"] == 0 and len(easy["verifier_round_s"]) == 3
    assert 0 < easy["verifier_ms"]["median"] <= easy["verifier_ms"]["max"]
