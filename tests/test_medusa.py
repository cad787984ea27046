"""Medusa heads trained from the target alone: they learn, they refuse other targets, files are
atomic, and speculation with them is exact (greedy token-identical, sampling the target's law)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from click.testing import CliRunner
from test_decode_sampling import fit, models  # noqa: F401  (models: the V=4 fixture fit() samples)

from mlxspec.bench.configs import parse_drafters
from mlxspec.frontend.cli import cli
from mlxspec.drafters import MedusaDrafter, make_drafter, parse_drafter
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.heads import medusa
from mlxspec.heads.train import load_prompts
from mlxspec.options import GenerateOptions

HELD_OUT = load_prompts()[-6:]  # the fixture records answers to the first prompts only


def random_heads(model, dims: int, count: int, path, seed: int = 0):
    """Heads with random (non-zero) weights for `model`: exactness must not depend on training."""
    heads = medusa.MedusaHeads(dims, count)
    mx.random.seed(seed)
    for b in heads.blocks:
        b.weight = mx.random.normal(b.weight.shape) * 0.5
    return medusa.save(path, heads, {"dims": dims, "target_sha256": medusa.identity(model), "target": "test"})


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("medusa-home")


@pytest.fixture(scope="module")
def trained(tiny_llama, home):
    """(file, config): `mlxspec train-drafter` on tiny_llama's own answers to the first ~25 shipped prompts."""
    args = ["train-drafter", str(tiny_llama), "--kind", "medusa", "--tokens", "2400", "--heads", "3", "--epochs", "3",
            "--max-answer", "48", "--out", "tiny"]
    result = CliRunner().invoke(cli, args, env={"MLXSPEC_HOME": str(home)})
    assert result.exit_code == 0, result.output
    path = home / "drafters" / "tiny.safetensors"
    assert f"wrote {path}" in result.output
    return path, medusa.read(path)[1]


@pytest.fixture(scope="module")
def engine(tiny_llama, trained):
    return Engine.load(str(tiny_llama), drafter=f"medusa:{trained[0]}")


def accepted_on(engine, drafter, prompts) -> float:
    """Tokens per target pass with `drafter` over the model's own greedy answers (fixed k=3)."""
    engine.drafter, tokens, passes = drafter, 0, 0
    for text in prompts:
        ids = engine.chat_prompt([{"role": "user", "content": text}])
        *_, last = engine.generate(ids, GenerateOptions(max_tokens=40, temperature=0, draft_length=3, adaptive=False))
        tokens, passes = tokens + last.stats.generated_tokens, passes + last.stats.rounds
    return tokens / passes


def test_training_lowers_loss_and_beats_untrained_heads(engine, trained, tmp_path):
    path, config = trained
    assert config["loss"] < 0.8 * config["loss_start"]
    assert sum(config["heldout_top1"]) > sum(config["heldout_top1_untrained"])
    model = engine.target.model
    zero = medusa.save(tmp_path / "zero", medusa.MedusaHeads(config["dims"], 3),
                       {"dims": config["dims"], "target_sha256": medusa.identity(model)})
    learned = accepted_on(engine, MedusaDrafter(model, str(path)), HELD_OUT)
    untrained = accepted_on(engine, MedusaDrafter(model, str(zero)), HELD_OUT)
    assert learned > untrained + 0.2 and learned > 1.5


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_output_is_token_identical_to_plain(arch, tiny_llama, tiny_qwen2, trained, tmp_path):
    ref = str(tiny_llama if arch == "llama" else tiny_qwen2)
    plain = Engine.load(ref)
    # llama: the trained heads; qwen2 (tied head): random heads, exact whatever they propose
    path = trained[0] if arch == "llama" else random_heads(plain.target.model, 64, 4, tmp_path / "q")
    spec = Engine.load(ref, drafter=f"medusa:{path}")
    drafted = 0
    for text in ["Tell a story about a fox.", HELD_OUT[0], "def add(a, b):"]:
        ids = plain.encode(text)
        want = [t for e in plain.generate(ids, GenerateOptions(max_tokens=40, temperature=0)) for t in e.tokens]
        for k in (1, 2, 3, 4):
            for adaptive in (False, True):
                opts = GenerateOptions(max_tokens=40, temperature=0, draft_length=k, adaptive=adaptive)
                events = list(spec.generate(ids, opts))
                assert [t for e in events for t in e.tokens] == want, (text, k, adaptive)
                drafted += events[-1].stats.drafted
    assert drafted > 0  # the heads were really in play


@pytest.mark.parametrize("settings", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 3}], ids=["plain", "top-k"])
def test_sampling_matches_target_law(models, settings, tmp_path):  # noqa: F811
    target = models[0]
    drafter = MedusaDrafter(target, str(random_heads(target, 32, 2, tmp_path / "s", seed=1)))
    pvalue, acceptance = fit(target, drafter, settings, k=2, n=700)
    assert pvalue > 1e-3
    assert acceptance > 0.1  # drafts were really in play


def test_heads_load_by_name_and_refuse_another_target(trained, home, tiny_llama, tiny_llama_other, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(home))
    assert Engine.load(str(tiny_llama), drafter="medusa:tiny").drafter.name == "medusa:tiny"
    with pytest.raises(MlxspecError, match="trained for target .* not this target"):
        Engine.load(str(tiny_llama_other), drafter="medusa:tiny")


def test_an_interrupted_save_leaves_nothing_that_loads(trained, tmp_path, monkeypatch):
    heads, config = medusa.read(trained[0])
    target = tmp_path / "out.safetensors"

    def interrupted(src, dst):
        raise KeyboardInterrupt  # killed between writing the temp file and the rename

    monkeypatch.setattr(medusa.files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        medusa.save(target, heads, config)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    # A file cut short (a copy interrupted some other way) is refused, not half-loaded.
    medusa.save(target, heads, config)
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    with pytest.raises(MlxspecError, match="not a medusa drafter file"):
        medusa.read(target)


def test_names_and_cli_errors(tmp_path):
    assert parse_drafter("medusa:mine") == ("medusa", "mine")
    assert parse_drafters("lookup,medusa:mine", False) == ["lookup", "medusa:mine"]
    with pytest.raises(MlxspecError, match="medusa:NAME"):
        parse_drafter("medusa")
    env = {"MLXSPEC_HOME": str(tmp_path)}
    bad = CliRunner().invoke(cli, ["train-drafter", "some-model", "--kind", "medusa", "--heads", "9"], env=env)
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines()[-1].startswith("Error: --tokens must be >= 16, --heads 1..8")
    with pytest.raises(MlxspecError, match="no medusa heads at .*nope.safetensors"):
        make_drafter("medusa:nope", None)


def test_proposals_read_the_newest_hidden_row(engine, trained):
    """Nothing before the first hidden row; then greedy head guesses from row n of accept(n, hidden)."""
    from mlxspec.sampling import Sampling

    model, greedy = engine.target.model, Sampling()
    drafter = MedusaDrafter(model, str(trained[0]))
    drafter.start([1, 2, 3])
    assert drafter.propose([1, 2, 3], 4, greedy, None).count == 0
    hidden = mx.random.normal((3, 64), key=mx.random.key(5))
    drafter.accept(2, hidden)
    draft = drafter.propose([1, 2, 3], 4, greedy, None)
    want = mx.argmax(medusa.logits(drafter.heads, model, hidden[2]), axis=-1)
    assert draft.count == 3 and draft.tokens.tolist() == want.tolist() != mx.argmax(
        medusa.logits(drafter.heads, model, hidden[0]), axis=-1).tolist()


def test_tree_proposals_put_each_heads_favourite_first(engine, trained):
    """width w: per head its w best tokens, best first; the favourites are the chain's drafts."""
    from mlxspec.sampling import Sampling

    model, greedy = engine.target.model, Sampling()
    drafter = MedusaDrafter(model, str(trained[0]))
    drafter.start([1, 2, 3])
    hidden = mx.random.normal((3, 64), key=mx.random.key(6))
    drafter.accept(2, hidden)
    chain = drafter.propose([1, 2, 3], 3, greedy, None)
    tree = drafter.propose([1, 2, 3], 3, greedy, None, width=3)
    assert tree.count == 9 and tree.parents == [0, 0, 0, 1, 1, 1, 4, 4, 4]
    ranked = tree.tokens.reshape(3, 3)
    assert ranked[:, 0].tolist() == chain.tokens.tolist()
    rows = medusa.logits(drafter.heads, model, hidden[2], 3)
    for depth in range(3):
        assert sorted(ranked[depth].tolist()) == sorted(mx.argsort(-rows[depth])[:3].tolist())
        picked = rows[depth][ranked[depth]].tolist()
        assert picked == sorted(picked, reverse=True)
