"""EAGLE heads trained from the target alone: they learn, speculation with them is exact (greedy
token-identical, sampling the target's law), the prompt's features reach them, files are refused
for other targets."""

from __future__ import annotations

import mlx.core as mx
import pytest
from click.testing import CliRunner
from model_factory import random_head  # (test_tree and test_row_positions import it from here too)
from test_decode_sampling import fit, models  # noqa: F401  (models: the V=4 fixture fit() samples)

from mlxspec.bench.configs import parse_drafters
from mlxspec.prefix_cache import PrefixCache
from mlxspec.drafters import EagleDrafter, parse_drafter
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.features import target_forward
from mlxspec.frontend.cli import cli
from mlxspec.heads import eagle, eagle_train
from mlxspec.heads.eagle_train import forward_two
from mlxspec.heads.record import load_prompts, record
from mlxspec.heads.record_batch import record_wave
from mlxspec.heads.train import frozen_head
from mlxspec.options import GenerateOptions
from mlxspec.sampling import Sampling

HELD_OUT = load_prompts()[-6:]  # the fixture records answers to the first prompts only


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("eagle-home")


@pytest.fixture(scope="module")
def trained(tiny_llama, home):
    """(file, config): `mlxspec train-drafter --kind eagle` on tiny_llama's answers to the first prompts."""
    args = ["train-drafter", str(tiny_llama), "--kind", "eagle", "--tokens", "1200", "--epochs", "6",
            "--max-answer", "48", "--out", "tiny"]
    result = CliRunner().invoke(cli, args, env={"MLXSPEC_HOME": str(home)})
    assert result.exit_code == 0, result.output
    path = home / "drafters" / "tiny.safetensors"
    assert f"wrote {path}" in result.output
    return path, eagle.read(path)[2]


@pytest.fixture(scope="module")
def plain(tiny_llama):
    return Engine.load(str(tiny_llama))


def tokens_per_pass(engine, prompts, k: int = 3) -> float:
    tokens = passes = 0
    for text in prompts:
        ids = engine.chat_prompt([{"role": "user", "content": text}])
        *_, last = engine.generate(ids, GenerateOptions(max_tokens=40, temperature=0, draft_length=k, adaptive=False))
        tokens, passes = tokens + last.stats.generated_tokens, passes + last.stats.rounds
    return tokens / passes


def test_training_learns_and_beats_an_untrained_head(tiny_llama, trained, tmp_path):
    path, config = trained
    assert config["loss"] < 0.7 * config["loss_start"]
    first, second = config["heldout_top1"]
    assert first > config["heldout_top1_untrained"][0] + 0.2 and second > config["heldout_top1_untrained"][1] + 0.2
    assert 16 <= config["draft_vocab"] <= 4096 and config["coverage"] > 0.9
    untrained = random_head(Engine.load(str(tiny_llama)).target.model, tmp_path / "u")
    learned = tokens_per_pass(Engine.load(str(tiny_llama), drafter=f"eagle:{path}"), HELD_OUT)
    baseline = tokens_per_pass(Engine.load(str(tiny_llama), drafter=f"eagle:{untrained}"), HELD_OUT)
    assert learned > baseline + 0.5 and learned > 1.8, (learned, baseline)


def test_hard_labels_learn_the_targets_argmax(tiny_llama, trained, home):
    """--labels hard: the same recordings (resumed), the token term against the target's argmax
    instead of its distribution (the default, `trained`); the head learns, and says how it was trained."""
    args = ["train-drafter", str(tiny_llama), "--kind", "eagle", "--tokens", "1200", "--epochs", "6",
            "--max-answer", "48", "--labels", "hard", "--out", "tiny-hard"]
    result = CliRunner().invoke(cli, args, env={"MLXSPEC_HOME": str(home)})
    assert result.exit_code == 0, result.output
    config = eagle.read(home / "drafters" / "tiny-hard.safetensors")[2]
    assert config["labels"] == "hard" and trained[1]["labels"] == "soft"
    assert config["training_tokens"] == trained[1]["training_tokens"]  # the same answers, not re-recorded
    first, second = config["heldout_top1"]
    assert first > config["heldout_top1_untrained"][0] + 0.2 and second > config["heldout_top1_untrained"][1] + 0.2
    bad = CliRunner().invoke(cli, args[:-4] + ["--labels", "fuzzy"], env={"MLXSPEC_HOME": str(home)})
    assert bad.exit_code == 1 and "fuzzy" in bad.output and "Traceback" not in bad.output


def test_soft_loss_is_the_cross_entropy_against_the_targets_law(tiny_llama):
    """The soft token term: KL from softmax(target head on h_t) at every position (a
    label outside the draft vocabulary, -2, too; step two from t = 1); the hard one against y_t where
    y_t is known. The feature terms are shared, so the two losses differ by exactly these terms."""
    model = Engine.load(str(tiny_llama)).target.model
    dims = eagle.block_config(model)["hidden_size"]
    w, b = frozen_head(model, dims)
    mx.random.seed(1)
    head = eagle.EagleHead(eagle.block_config(model))
    e, h_in, h = (mx.random.normal((1, 5, dims)) for _ in range(3))
    y = mx.array([[1, 2, -2, 3, -1]])
    batch = (e, h_in, h, y, mx.ones((1, 5), dtype=mx.bool_))
    soft, _ = eagle_train.losses(head, w, b, batch, 0.0, None, 1.0, soft=True)
    hard, _ = eagle_train.losses(head, w, b, batch, 0.0, None, 1.0, soft=False)
    f, g = forward_two(head, e, h_in)
    teacher = mx.softmax(h @ w + b, axis=-1)[0]  # (5, V)
    entropy = -(teacher * mx.log(teacher)).sum(-1)  # (5,)

    def log_probs(x):
        logits = (x @ w + b)[0]
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    lf, lg = log_probs(f), log_probs(g)
    soft_terms = (-(teacher * lf).sum(-1) - entropy).mean() + 0.5 * (-(teacher[1:] * lg[1:]).sum(-1) - entropy[1:]).mean()
    hard_terms = -mx.mean(mx.stack([lf[t, int(y[0, t])] for t in (0, 1, 3)])) \
        - 0.5 * mx.mean(mx.stack([lg[t, int(y[0, t])] for t in (1, 3)]))
    assert abs(float(soft - hard) - float(soft_terms - hard_terms)) < 1e-3 * max(1.0, abs(float(soft_terms)))


def test_the_reported_top1_is_what_the_drafter_drafts(plain, trained, tmp_path):
    """The held-out top-1 that training reports is the share of depth-1 drafts the drafter gets right
    at run time, fed the target's real features at every answer position: a token outside the
    draft vocabulary counts as a miss in both (the report once left those out and read 5 points
    high on SmolLM2). The trained head gets half its draft vocabulary, so that some answer tokens
    are outside it."""
    model = plain.target.model
    samples = record(plain, HELD_OUT, tokens=400, max_answer=40, show=False)
    head, vocab, config = eagle.read(trained[0])
    vocab = vocab[::2]
    path = eagle.save(tmp_path / "half.safetensors", head, vocab, config)
    w, b = frozen_head(model, samples[0].hidden.shape[-1])
    ys = [eagle_train.next_tokens(model, s) for s in samples]
    reported = eagle_train.evaluate(head, w[:, vocab], b[vocab], eagle_train.Batches(model, samples, ys, vocab, 2, True))[0]
    drafter, greedy = EagleDrafter(model, str(path), bits=None), Sampling.from_options(GenerateOptions(temperature=0))
    hits = total = 0
    for s in samples:
        drafter.start(s.ids[: s.answer_start], hidden=s.hidden[: s.answer_start - 1])
        for t in range(s.answer_start - 1, len(s.ids) - 1):  # the context ends at t, not yet read
            hits += drafter.propose(s.ids[: t + 1], 1, greedy, None).tokens.item() == s.ids[t + 1]
            total += 1
            drafter.accept(0, hidden=s.hidden[t : t + 1])  # as if the draft missed: the next round reads t+1
        drafter.finish()
    inside = set(vocab.tolist())
    outside = sum(t not in inside for s in samples for t in s.ids[s.answer_start :])
    assert outside > 0  # the held-out answers hold tokens the draft vocabulary lacks
    assert abs(hits / total - reported) <= 1.5 / total, (hits, total, reported)


def test_the_unrolled_training_pass_is_the_drafters_chain(tiny_llama, trained):
    """forward_two's step one equals the head over a sequence; its step two at t equals what the
    drafter computes there: the cache holding the real entries < t, fed (c_t, f_{t-1})."""
    head = eagle.read(trained[0])[0]
    dims = head.dims
    mx.random.seed(5)
    e, h = mx.random.normal((1, 7, dims)), mx.random.normal((1, 7, dims))
    f, g = forward_two(head, e, h)
    assert mx.allclose(f, head(e, h, mask="causal"), atol=1e-5)
    from mlx_lm.models.cache import KVCache

    for t in (1, 3, 6):
        cache = KVCache()
        head(e[:, :t], h[:, :t], cache, "causal" if t > 1 else None)
        step = head(e[:, t : t + 1], f[:, t - 1 : t], cache)
        assert mx.allclose(step[0, 0], g[0, t], atol=1e-4), t


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_output_is_token_identical_to_plain(arch, tiny_llama, tiny_qwen2, trained, tmp_path):
    ref = str(tiny_llama if arch == "llama" else tiny_qwen2)
    plain = Engine.load(ref)
    # llama: the trained head; qwen2 (tied head): a random head over part of the vocabulary
    path = trained[0] if arch == "llama" else random_head(plain.target.model, tmp_path / "q", vocab=40)
    spec = Engine.load(ref, drafter=f"eagle:{path}")
    drafted = 0
    for text in ["Tell a story about a fox.", HELD_OUT[0], "def add(a, b):"]:
        ids = plain.encode(text)
        want = [t for e in plain.generate(ids, GenerateOptions(max_tokens=40, temperature=0)) for t in e.tokens]
        for k in (1, 2, 4, 6):
            for adaptive in (False, True):
                opts = GenerateOptions(max_tokens=40, temperature=0, draft_length=k, adaptive=adaptive)
                events = list(spec.generate(ids, opts))
                assert [t for e in events for t in e.tokens] == want, (text, k, adaptive)
                drafted += events[-1].stats.drafted
    assert drafted > 0


@pytest.mark.parametrize("kernels", ["ops", False])
def test_compiled_draft_steps_draft_what_eager_ones_draft(tiny_llama, trained, monkeypatch, kernels):
    """EAGLE's draft steps through compiled graphs (step_graph.py, as GPUs run them): the same drafts,
    hence the same tokens and acceptance, as steps built eagerly; greedy and sampled."""
    runs = []
    for compiled in ("0", "1"):
        monkeypatch.setenv("MLXSPEC_COMPILE", compiled)
        spec = Engine.load(str(tiny_llama), drafter=f"eagle:{trained[0]}", kernels=kernels)
        drafts, propose = [], spec.drafter.propose
        monkeypatch.setattr(spec.drafter, "propose", lambda *a, **k: drafts.append(propose(*a, **k)) or drafts[-1])
        out = []
        for temperature in (0.0, 0.8):
            opts = GenerateOptions(max_tokens=40, temperature=temperature, seed=3, draft_length=4, adaptive=False)
            events = list(spec.generate(spec.encode("Tell a story about a fox."), opts))
            out.append(([t for e in events for t in e.tokens], events[-1].stats.accepted_per_position))
        runs.append((out, [d.tokens.tolist() for d in drafts]))
        assert bool(spec.drafter.steps.graphs) == (compiled == "1") and spec.drafter.steps.off in (None, "off")
    assert runs[0] == runs[1] and sum(runs[0][0][0][1]) > 0  # drafts were kept


def test_a_chat_turn_reuses_the_prefix_and_stays_exact(plain, tiny_llama, trained):
    spec = Engine.load(str(tiny_llama), drafter=f"eagle:{trained[0]}")
    history = [{"role": "user", "content": HELD_OUT[1]}]
    for turn in range(2):
        ids = plain.chat_prompt(history)
        opts = GenerateOptions(max_tokens=30, temperature=0, draft_length=3, adaptive=False)  # timing-free
        want = [t for e in plain.generate(ids, opts) for t in e.tokens]
        events = list(spec.generate(ids, opts))
        assert [t for e in events for t in e.tokens] == want
        assert events[-1].stats.accepted > 0  # the prompt's features arrived (the cached prefix's too)
        if turn:
            assert events[-1].stats.cached_tokens > 0
        history += [{"role": "assistant", "content": plain.tokenizer.decode(want)}, {"role": "user", "content": "More."}]


def test_a_client_leaving_stops_the_heads_prefill_at_the_next_chunk(plain, tiny_llama, trained, monkeypatch):
    """The head reads the prompt's features after the target, a chunk at a time: a request cancelled by then ends
    'cancelled' at the head's next chunk, and the engine then serves the same prompt exactly (its prefix reused)."""
    import threading

    monkeypatch.setattr("mlxspec.drafters.eagle.PREFILL_CHUNK", 8)
    spec = Engine.load(str(tiny_llama), drafter=f"eagle:{trained[0]}")
    ids = plain.encode(HELD_OUT[2] + " " + HELD_OUT[3])
    assert len(ids) > 3 * 8
    cancel, feeds, feed = threading.Event(), [], spec.drafter._feed

    def leave_after_the_first_chunk(tokens, features, token=None):
        feeds.append(features.shape[0])
        cancel.set()  # the client leaves while the head reads its first chunk
        return feed(tokens, features, token)

    monkeypatch.setattr(spec.drafter, "_feed", leave_after_the_first_chunk)
    opts = GenerateOptions(max_tokens=20, temperature=0, draft_length=3, adaptive=False)
    events = list(spec.generate(ids, opts, cancel=cancel))
    assert events[-1].finish_reason == "cancelled" and events[-1].stats.generated_tokens == 0 and feeds == [8]
    monkeypatch.setattr(spec.drafter, "_feed", feed)
    events = list(spec.generate(ids, opts))
    want = [t for e in plain.generate(ids, opts) for t in e.tokens]
    assert [t for e in events for t in e.tokens] == want and events[-1].stats.cached_tokens == len(ids) - 1


def test_recording_keeps_the_features_the_target_decoded_with(plain):
    """Recorded during decoding (no second pass): each row is the target's hidden state there, the
    answer is its own greedy continuation, and only the last answer token (never read) is left out."""
    samples = record(plain, load_prompts()[:2], tokens=40, max_answer=20, show=False)
    for s in samples:
        answer = s.ids[s.answer_start :]
        assert s.hidden.shape == (len(s.ids), plain.target.model.args.hidden_size) and len(answer) >= 3
        want = target_forward(plain.target.model, mx.array(s.ids)[None])[1][0]
        assert mx.allclose(s.hidden, want, atol=1e-5).item()
        greedy = [t for e in plain.generate(s.ids[: s.answer_start], GenerateOptions(max_tokens=20, temperature=0))
                  for t in e.tokens]
        assert greedy[: len(answer)] == answer and len(greedy) in (len(answer), len(answer) + 1)


@pytest.mark.parametrize("chunk", [512, 5], ids=["one-chunk", "chunked-prefill"])
def test_batched_recording_gives_the_targets_answers_and_features(plain, chunk, monkeypatch):
    """Answers decoded side by side (left-padded prompts of different lengths, one leaving the
    batch early at its end token) are the target's own greedy answers, with its hidden states;
    whether the prompts are read in one pass or in chunks."""
    monkeypatch.setattr("mlxspec.heads.record_batch.PREFILL_CHUNK", chunk)
    prompts = [plain.chat_prompt([{"role": "user", "content": p}]) for p in load_prompts()[:4]]
    assert len(set(map(len, prompts))) > 1
    greedy = [[t for e in plain.generate(ids, GenerateOptions(max_tokens=12, temperature=0)) for t in e.tokens]
              for ids in prompts]

    def cut(stop):
        return [g[: g.index(stop)] if stop in g else g for g in greedy]

    # an end token that one answer writes mid-way and another later or not at: the batch shrinks
    stop = next(t for g in greedy for t in g if 0 < min(map(len, cut(t))) < max(map(len, cut(t))))
    want = cut(stop)
    waves = record_wave(plain, prompts, 12, eos={stop})
    assert [answer for answer, _ in waves] == want
    for ids, (answer, hidden) in zip(prompts, waves):
        rows = min(hidden.shape[0], len(ids) + len(answer))
        reference = target_forward(plain.target.model, mx.array(ids + answer)[None])[1][0]
        assert rows >= len(ids) + len(answer) - 1
        assert mx.allclose(hidden[:rows], reference[:rows], atol=1e-4).item()
    batched = record(plain, load_prompts()[:4], tokens=10_000, max_answer=12, show=False, batch=3)
    assert [s.ids for s in batched] == [s.ids for s in record(plain, load_prompts()[:4], 10_000, 12, False)]


def test_prefix_cache_features_are_the_targets_hidden_states(tiny_llama):
    model = Engine.load(str(tiny_llama), kernels=False).target.model
    ids = list(range(5, 40))
    want = target_forward(model, mx.array(ids)[None])[1][0]
    kv = PrefixCache(model)
    assert kv.prepare(ids, features=True) == 0
    assert mx.allclose(kv.hidden, want, atol=1e-5)
    other = ids[:20] + [3, 4, 5]
    assert kv.prepare(other, features=True) == 20  # the shared prefix's features are kept
    assert mx.allclose(kv.hidden, target_forward(model, mx.array(other)[None])[1][0], atol=1e-5)
    kv.prepare(ids[:10])  # a request without features keeps only features of tokens it holds
    assert kv.hidden.shape[0] == 10


@pytest.mark.parametrize("settings", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 3}], ids=["plain", "top-k"])
def test_sampling_matches_target_law(models, settings, tmp_path):  # noqa: F811
    target = models[0]
    drafter = EagleDrafter(target, str(random_head(target, tmp_path / "s", seed=1, vocab=3)))
    pvalue, acceptance = fit(target, drafter, settings, k=2, n=700)
    assert pvalue > 1e-3
    assert acceptance > 0.1  # drafts were really in play


def test_heads_load_by_name_and_refuse_another_target(trained, home, tiny_llama, tiny_llama_other, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(home))
    assert Engine.load(str(tiny_llama), drafter="eagle:tiny").drafter.name == "eagle:tiny"
    with pytest.raises(MlxspecError, match="trained for target .* not this target"):
        Engine.load(str(tiny_llama_other), drafter="eagle:tiny")
    with pytest.raises(MlxspecError, match="holds a 'eagle' drafter, not medusa"):
        Engine.load(str(tiny_llama), drafter="medusa:tiny")


def test_recording_resumes_from_kept_samples(tiny_llama, home, trained):
    """A second run finds the first run's recordings: nothing is generated again."""
    kept = list((home / "drafters" / ".recordings").glob("*/*.safetensors"))
    assert len(kept) >= 10
    args = ["train-drafter", str(tiny_llama), "--kind", "eagle", "--tokens", "1200", "--epochs", "6",
            "--max-answer", "48", "--out", "again"]
    result = CliRunner().invoke(cli, args, env={"MLXSPEC_HOME": str(home)})
    assert result.exit_code == 0, result.output
    assert sorted((home / "drafters" / ".recordings").glob("*/*.safetensors")) == sorted(kept)
    again = eagle.read(home / "drafters" / "again.safetensors")
    assert again[2]["heldout_top1"] == trained[1]["heldout_top1"]  # same data, same seed: same head
    assert mx.array_equal(again[0].fc.weight, eagle.read(trained[0])[0].fc.weight)


def test_names_and_cli_errors(tmp_path):
    assert parse_drafter("eagle:mine") == ("eagle", "mine")
    assert parse_drafters("lookup,eagle:mine", False) == ["lookup", "eagle:mine"]
    with pytest.raises(MlxspecError, match="eagle:NAME"):
        parse_drafter("eagle")
    env = {"MLXSPEC_HOME": str(tmp_path)}
    bad = CliRunner().invoke(cli, ["train-drafter", "some-model", "--kind", "hydra"], env=env)
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines() == ["Error: --kind 'hydra': only eagle, medusa can be trained"]
    bad = CliRunner().invoke(cli, ["train-drafter", "some-model", "--batch", "0"], env=env)
    assert bad.exit_code == 1 and "--batch 1..64" in bad.output and len(bad.output.strip().splitlines()) == 1
    with pytest.raises(MlxspecError, match="no eagle drafter at .*nope.safetensors"):
        EagleDrafter(None, "nope")
