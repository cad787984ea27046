"""mlxspec.gguf_tokenizer: GGUF vocabularies rebuilt with `tokenizers`, split as llama.cpp splits.

The pre-tokenizer is checked against an independent reading of llama.cpp's rule (each regex in
turn over the previous pieces, text between matches kept as pieces) run by the `regex` module,
a different regex engine from the Oniguruma inside `tokenizers`.
"""

from __future__ import annotations

import pytest
import regex

import gguf_fixtures as fx
from mlxspec.errors import ModelLoadError
from mlxspec.gguf import load_gguf
from mlxspec.gguf_tokenizer import _PRE_TYPES, PRE_TOKENIZERS, build_backend, set_special_template

TEXTS = [
    "Hello's world!! It'S 12345 apples,\n\n  x+=1 \t",
    "naïve café — “quotes” 🙂 日本語 ١٢٣",
    "cafe\u0301 \u0915\u093f\u0928\u093e\u0930\u093e e\u0301\u0301!",  # combining marks (qwen35 keeps them)
    "def f(a, b):\n    return a**2 + b  # I'd say so\r\n",
]


def gpt2_vocab(pre: str, extra: tuple[str, ...] = ()) -> dict:
    return {"model": "gpt2", "pre": pre, "tokens": fx.byte_level_vocab() + list(extra), "merges": fx.MERGES}


def llama_cpp_split(text: str, regexes: list[str]) -> list[str]:
    pieces = [text]
    for expr in regexes:
        out = []
        for piece in pieces:
            start = 0
            for m in regex.finditer(expr, piece):
                out += [piece[start : m.start()]] if m.start() > start else []
                out.append(m.group())
                start = m.end()
            out += [piece[start:]] if start < len(piece) else []
        pieces = out
    return pieces


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_pre_tokenizer_splits_like_llama_cpp(pre):
    backend = build_backend(gpt2_vocab(pre), "t.gguf")
    spelling, regexes = fx._bytes_to_unicode(), _PRE_TYPES[PRE_TOKENIZERS[pre]][0]
    for text in TEXTS:
        want = ["".join(spelling[b] for b in piece.encode()) for piece in llama_cpp_split(text, regexes)]
        assert [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(text)] == want, text


def test_pre_tokenizers_differ_where_llama_cpp_says():
    """Digits: one by one (smollm, qwen2), in threes (llama-3), or whole (gpt-2)."""
    pieces = {pre: [p for p, _ in build_backend(gpt2_vocab(pre), "t").pre_tokenizer.pre_tokenize_str(" 12345")]
              for pre in ("gpt-2", "smollm", "llama-bpe", "qwen2")}
    assert pieces == {"gpt-2": ["Ġ12345"], "smollm": ["Ġ", "1", "2", "3", "4", "5"],
                      "llama-bpe": ["Ġ", "123", "45"], "qwen2": ["Ġ", "1", "2", "3", "4", "5"]}


def test_o200k_keeps_contractions_with_their_word():
    """gpt-oss's o200k ("gpt-4o"): a contraction stays with its word, case-blind; digits in threes."""
    def split(pre, text):
        return [p for p, _ in build_backend(gpt2_vocab(pre), "t").pre_tokenizer.pre_tokenize_str(text)]

    assert split("gpt-4o", " It'S 12345") == ["ĠIt'S", "Ġ", "123", "45"]
    assert split("llama-bpe", " It'S 12345") == ["ĠIt", "'S", "Ġ", "123", "45"]


def test_tekken_splits_case_runs_and_single_digits():
    """Mistral's tekken: o200k's letter runs without its contractions, digits one by one."""
    pieces = [p for p, _ in build_backend(gpt2_vocab("tekken"), "t").pre_tokenizer.pre_tokenize_str(" It'S 12345")]
    assert pieces == ["ĠIt", "'S", "Ġ", "1", "2", "3", "4", "5"]


def test_qwen35_keeps_combining_marks_with_their_letters():
    """Qwen3.5's pre-tokenizer is qwen2's with \\p{M} among the letters: a decomposed "é" (e + U+0301)
    and a Devanagari vowel sign stay in their words, where qwen2 splits the mark off as punctuation."""
    def split(pre, text):
        return [p for p, _ in build_backend(gpt2_vocab(pre), "t").pre_tokenizer.pre_tokenize_str(text)]

    text = " cafe\u0301 \u0915\u093f"
    spelled = lambda s: "".join(fx._bytes_to_unicode()[b] for b in s.encode())  # noqa: E731
    assert split("qwen35", text) == [spelled(" cafe\u0301"), spelled(" \u0915\u093f")]
    assert split("qwen2", text) == [spelled(" cafe"), spelled("\u0301"), spelled(" \u0915"), spelled("\u093f")]


@pytest.mark.parametrize("pre", ["llama-bpe", "tekken"])
def test_llama3_takes_whole_tokens_before_merging(pre):
    """llama.cpp sets ignore_merges for llama-3 and tekken: a piece that is a token is that token."""
    vocab = gpt2_vocab(pre, extra=("Ġxyz",))
    tokens = vocab["tokens"]
    assert [tokens[i] for i in build_backend(vocab, "t").encode(" xyz").ids] == ["Ġxyz"]
    vocab["pre"] = "gpt-2"  # no merge builds it, so BPE alone spells it out
    assert [tokens[i] for i in build_backend(vocab, "t").encode(" xyz").ids] == ["Ġ", "x", "y", "z"]


def test_byte_level_round_trip_and_control_tokens():
    types = [3] * len(fx.SPECIALS) + [1] * (len(fx.byte_level_vocab()) - len(fx.SPECIALS))  # CONTROL, NORMAL
    backend = build_backend(gpt2_vocab("smollm") | {"token_type": types}, "t")
    for text in TEXTS:
        assert backend.decode(backend.encode(text).ids) == text
    assert backend.encode("<|im_start|>user<|im_end|>").ids == [1] + backend.encode("user").ids + [2]
    assert backend.encode("a<|im_end|>b").ids == backend.encode("a").ids + [2] + backend.encode("b").ids


def spm_vocab(**extra) -> dict:
    tokens, scores, types = fx.sentencepiece_vocab()
    return {"model": "llama", "tokens": tokens, "scores": scores, "token_type": types, "unknown_token_id": 0} | extra


def test_sentencepiece_space_after_special_and_no_prefix():
    vocab = spm_vocab()
    tokens = vocab["tokens"]
    # llama.cpp puts a space before the text and after every special token.
    ids = build_backend(vocab, "t").encode("the</s>world").ids
    assert [tokens[i] for i in ids] == ["\u2581the", "</s>", "\u2581world"]
    plain = build_backend(spm_vocab(add_space_prefix=False), "t")
    assert [tokens[i] for i in plain.encode("the world").ids] == ["t", "he", "\u2581world"]
    assert plain.decode(plain.encode("the world").ids) == "the world"


@pytest.mark.parametrize("ab, bc, want", [(2.0, 1.0, ["ab", "c"]), (1.0, 2.0, ["a", "bc"])])
def test_sentencepiece_merges_follow_scores(ab, bc, want):
    """Where two merges overlap ("ab" and "bc" in "abc"), the better-scored token wins."""
    tokens = ["<unk>", "a", "b", "c", "ab", "bc"]
    vocab = {"model": "llama", "tokens": tokens, "scores": [0, 0, 0, 0, ab, bc], "token_type": [2] + [1] * 5,
             "add_space_prefix": False}
    assert [tokens[i] for i in build_backend(vocab, "t").encode("abc").ids] == want


@pytest.mark.parametrize(
    "vocab, named",
    [
        (gpt2_vocab("smollm") | {"model": "t5"}, "'t5'"),
        (gpt2_vocab("made-up-pre"), "'made-up-pre'"),
        (gpt2_vocab("smollm") | {"merges": ["Ġ t", "no-space"]}, "'no-space'"),
        (gpt2_vocab("smollm") | {"merges": ["Ġ zz"]}, "cannot build"),  # a merge naming no token
        (spm_vocab(scores=[0.0]), "score"),
        (gpt2_vocab("smollm") | {"tokens": []}, "no tokenizer"),
    ],
)
def test_bad_vocabularies_refused(vocab, named):
    with pytest.raises(ModelLoadError, match=named):
        build_backend(vocab, "t.gguf")


def test_unknown_pre_tokenizer_refused_on_load(tmp_path):
    path = fx.write_tiny_llama_gguf(tmp_path / "pre.gguf", "Q4_0", pre="made-up-pre")
    with pytest.raises(ModelLoadError, match="pre.gguf: pre-tokenizer 'made-up-pre'"):
        load_gguf(path)


@pytest.mark.parametrize("pre, add_bos, bos", [("llama-bpe", None, True), ("llama-bpe", False, False),
                                               ("tekken", None, True), ("smollm", None, False), ("smollm", True, True)])
def test_bos_follows_the_file_then_llama_cpp_default(tmp_path, pre, add_bos, bos):
    """No add_bos flag: llama.cpp adds BOS for llama-3 and tekken vocabularies, not for other byte-level ones."""
    _, tokenizer, _ = load_gguf(fx.write_tiny_llama_gguf(tmp_path / "b.gguf", "Q4_0", pre=pre, add_bos=add_bos))
    ids = tokenizer.encode(" the world")
    assert (ids[0] == fx.BOS_ID) is bos and len(ids) == 2 + bos


def test_special_template_adds_bos_and_eos_as_asked():
    backend = build_backend(spm_vocab(), "t")
    text = backend.encode("the").ids
    for bos, eos, want in [((1, "<s>"), None, [1, *text]), (None, (2, "</s>"), [*text, 2]),
                           ((1, "<s>"), (2, "</s>"), [1, *text, 2])]:
        set_special_template(backend, bos, eos)
        assert backend.encode("the").ids == want


def test_harmony_vocabulary_ends_generation_at_return_and_call(tmp_path):
    """gpt-oss: <|end|> closes a message (its reasoning, then more), so only <|return|> and <|call|> end
    the reply, whatever the file names as EOS and EOT."""
    from pathlib import Path

    from mlxspec.gguf import _build_tokenizer

    harmony = ["<|return|>", "<|call|>", "<|end|>"]
    tokens = fx.byte_level_vocab() + harmony
    metadata = {f"tokenizer.ggml.{k}": v for k, v in {
        "model": "gpt2", "pre": "gpt-4o", "tokens": tokens, "merges": fx.MERGES,
        "token_type": [3] * len(fx.SPECIALS) + [1] * (len(tokens) - len(fx.SPECIALS) - 3) + [3] * 3,
        "eos_token_id": tokens.index("<|return|>"), "eot_token_id": tokens.index("<|end|>")}.items()}
    wrapper = _build_tokenizer(metadata, Path("oss.gguf"))
    texts = {"<|endoftext|>", "<|im_end|>"}  # in fx's vocabulary, and among llama.cpp's end-of-generation texts
    assert set(wrapper.eos_token_ids) == {tokens.index(t) for t in ("<|return|>", "<|call|>", *texts)}
    del metadata["tokenizer.ggml.tokens"][-3:], metadata["tokenizer.ggml.token_type"][-3:]
    metadata["tokenizer.ggml.eos_token_id"], metadata["tokenizer.ggml.eot_token_id"] = fx.EOS_ID, 1
    assert set(_build_tokenizer(metadata, Path("x.gguf")).eos_token_ids) == {fx.EOS_ID, 1, 0}  # others as before


def test_end_of_generation_follows_llama_cpp():
    """llama.cpp ends generation at EOS, EOT and EOM, at every token whose text it lists (whatever the file
    names: a Llama 3 file saying <|end_of_text|> still stops at <|eot_id|>), and at the FIM pad, repo and
    file-separator tokens (Qwen2.5-Coder's), by metadata id or else by text; plain tokens do not end it."""
    from mlxspec.gguf_tokenizer import end_of_generation

    tokens = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|fim_pad|>", "<|repo_name|>",
              "<|file_sep|>", "<|fim_prefix|>", "hello", "<end_of_turn>", "<PAD>"]
    ids = end_of_generation({"tokens": tokens, "eos_token_id": 1})
    assert ids[0] == 1 and set(ids) == {1, 2, 3, 4, 5, 6, 9}  # not <|fim_prefix|>, hello, <PAD> (fim_pad found first)
    assert set(end_of_generation({"tokens": tokens, "eos_token_id": 8, "fim_pad_token_id": 10})) == {8, 1, 2, 3, 5, 6, 9, 10}
    assert end_of_generation({"tokens": ["a", "b"], "eos_token_id": 1}) == [1]
