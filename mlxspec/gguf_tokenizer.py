"""A GGUF file's vocabulary -> a `tokenizers.Tokenizer` that gives llama.cpp's token ids.

    backend = build_backend(vocab, "model.gguf")   # vocab: the tokenizer.ggml.* keys, plain Python

A GGUF carries no tokenizer.json: it stores the tokens, their types, and the merges (BPE) or the
scores (sentencepiece), and names the algorithm (`tokenizer.ggml.model`) and the way text is split
before it (`tokenizer.ggml.pre`). llama.cpp is the reference for what those names mean
(src/llama-vocab.cpp); we rebuild the same tokenizer from the `tokenizers` library's public parts,
so no private builder of transformers is needed (they moved between releases).

- "gpt2": byte-level BPE with the file's merges. llama.cpp splits text with a list of regexes per
  pre-tokenizer name; each runs over the pieces the previous one left and keeps the text between
  matches as pieces too, which is `Split(behavior="isolated")` applied in sequence.
- "llama" (sentencepiece): a space before the text and after each special token, spaces written
  "▁", then adjacent symbols merge whenever their concatenation is a token, highest score first;
  what no token covers falls back to the <0xNN> byte tokens. That is BPE with merges ranked by
  the merged token's score, and byte fallback.
- "gemma4" (Gemma 4): BPE with the file's merges over the text's own characters (no byte mapping), spaces
  written "▁", split only into runs of newlines and runs of anything else (llama.cpp's GEMMA4 pre-type,
  `[^\n]+|[\n]+`), byte fallback for what no token covers.

Tokens typed CONTROL, USER_DEFINED or UNKNOWN are matched whole in the text, as llama.cpp does
when it parses special tokens: here they are added tokens.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.processors import TemplateProcessing

from .errors import ModelLoadError

# llama.cpp's token types (llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp's BPE regexes (llm_tokenizer_bpe), copied as they are there.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Qwen3.5: qwen2's, with combining marks (\p{M}) kept with their letters and out of punctuation runs
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k (gpt-oss, llama4): the tokenizer.json regex llama.cpp quotes (its own is a std::regex
# approximation of it; the tokenizers library runs the original)
_O200K = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral's tekken (Mistral NeMo, Ministral, Mistral Small 3.x, Devstral, Magistral): the tokenizer.json
# regex llama.cpp quotes; o200k's without contractions, digits one by one
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (regexes in order, ignore_merges) per llama.cpp pre-tokenizer type. ignore_merges: a piece that is
# a whole token is taken as it is, without merging (llama.cpp sets it for llama-3 and tekken).
_PRE_TYPES = {
    "default": ([r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"], False),
    "gpt2": ([_GPT2], False),
    "smollm": ([r"\p{N}", _GPT2], False),  # also starcoder, refact, command-r: digits one by one
    "llama3": ([_LLAMA3], True),
    "dbrx": ([_LLAMA3], False),  # llama-3's regex without its ignore_merges and BOS (dbrx, smaug-bpe)
    "qwen2": ([_QWEN2], False),
    "qwen35": ([_QWEN35], False),
    "gpt-4o": ([_O200K], False),
    "tekken": ([_TEKKEN], True),
}
# tokenizer.ggml.pre names -> the types above (llama_vocab::impl::load).
PRE_TOKENIZERS = {
    "default": "default",
    **dict.fromkeys(["gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4"], "gpt2"),
    **dict.fromkeys(["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"], "smollm"),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "lfm2"], "llama3"),
    **dict.fromkeys(["dbrx", "smaug-bpe", "glm4", "chatglm-bpe"], "dbrx"),  # glm4: llama.cpp's CHATGLM4, llama-3's regex
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"], "qwen2"),
    **dict.fromkeys(["gpt-4o", "llama4", "minimax-m2"], "gpt-4o"),
    "tekken": "tekken",
    "qwen35": "qwen35",
}
# Pre-tokenizer types after which llama.cpp adds BOS unless the file says otherwise.
BOS_BY_DEFAULT = {"llama3", "tekken"}
# tokenizer.ggml.pre names for which llama.cpp never adds BOS, whatever the file says (GLM-4's chat
# template writes its own [gMASK]<sop> prefix).
NO_BOS = {"glm4", "chatglm-bpe"}

MODELS = ("gpt2", "llama", "gemma4")
# "▁" back to spaces, <0xNN> byte tokens back to their bytes
_SPM_DECODER = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])

# Tokens that end generation by their text, as llama.cpp's vocabulary loader lists them (llama-vocab.cpp:
# "determined based on the token text, which is obviously not ideal", issue 9606), then its FIM
# pad/repo/separator tokens (by metadata id, else by these texts).
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
             "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
             "<turn|>", "<|tool_response>")  # Gemma 4: a turn's end, a tool call handing over
FIM_TEXTS = {"fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
             "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
             "fim_sep": ("<|file_sep|>",)}


def end_of_generation(vocab: dict) -> list[int]:
    """The ids llama.cpp ends generation at (its special_eog_ids), EOS first: the FIM pad/repo/separator
    tokens, every token whose text is in EOG_TEXTS, EOS, EOT and EOM; gpt-oss's <|end|> is not one where
    <|return|> and <|call|> are (it closes a message, not the reply)."""
    tokens = vocab["tokens"]
    ids = {t: i for i, t in enumerate(tokens)}
    found = [vocab.get(f"{key}_token_id", next((ids[t] for t in texts if t in ids), None)) for key, texts in FIM_TEXTS.items()]
    found += [ids[t] for t in EOG_TEXTS if t in ids]
    found += [vocab.get(f"{key}_token_id") for key in ("eot", "eom")]
    eog = [i for i in dict.fromkeys([vocab.get("eos_token_id"), *found]) if i is not None and 0 <= i < len(tokens)]
    if all(t in ids for t in ("<|return|>", "<|call|>", "<|end|>")):
        eog.remove(ids["<|end|>"])
    return eog


def build_backend(vocab: dict, name: str) -> Tokenizer:
    """`vocab`: the file's `tokenizer.ggml.<key>` values by <key> (lists and plain scalars)."""
    kind, tokens = vocab.get("model"), vocab.get("tokens")
    if not tokens:
        raise ModelLoadError(f"{name} carries no tokenizer (no tokenizer.ggml.tokens)")
    types = list(vocab.get("token_type") or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise ModelLoadError(f"{name}: {len(types)} token types for {len(tokens)} tokens")
    ids = {token: i for i, token in enumerate(tokens)}
    try:
        if kind == "gpt2":
            tokenizer = _byte_level_bpe(vocab, ids, name)
        elif kind == "llama":
            tokenizer = _sentencepiece_bpe(vocab, tokens, types, ids, name)
        elif kind == "gemma4":
            tokenizer = _gemma4_bpe(vocab, ids, name)
        else:
            raise ModelLoadError(
                f"{name}: tokenizer model {kind!r} (tokenizer.ggml.model) is not supported "
                f"(supported: {', '.join(MODELS)})"
            )
    except ModelLoadError:
        raise
    except Exception as e:  # tokenizers raises plain Exception on a merge naming an absent token
        raise ModelLoadError(f"{name}: cannot build its {kind!r} tokenizer: {e}") from None
    # Longest first, as llama.cpp matches them; `special` ones are dropped by skip_special_tokens.
    whole = sorted((i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN)),
                   key=lambda i: -len(tokens[i]))
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=types[i] != USER_DEFINED, normalized=False) for i in whole if tokens[i]]
    )
    return tokenizer


def pre_tokenizer_type(vocab: dict, name: str) -> str:
    """The llama.cpp pre-tokenizer type a "gpt2" vocabulary names; a missing name is "default",
    as in llama.cpp (which warns that quality will suffer)."""
    pre = vocab.get("pre") or "default"
    if pre not in PRE_TOKENIZERS:
        raise ModelLoadError(
            f"{name}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported "
            f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    return PRE_TOKENIZERS[pre]


def set_special_template(tokenizer: Tokenizer, bos: tuple[int, str] | None, eos: tuple[int, str] | None) -> None:
    """Add BOS (id, token) before and EOS after every encoded text; None: do not add that one."""
    if bos is None and eos is None:
        return

    def around(seq: str, type_id: int) -> str:  # "<s>:0 $A:0": BOS/EOS take the type id of their text
        parts = [token for token in (bos and bos[1], seq, eos and eos[1]) if token]
        return " ".join(f"{part}:{type_id}" for part in parts)

    tokenizer.post_processor = TemplateProcessing(
        single=around("$A", 0),
        pair=around("$A", 0) + " " + around("$B", 1),
        special_tokens=[(token, token_id) for token_id, token in filter(None, (bos, eos))],
    )


def _merge_pairs(vocab: dict, name: str) -> list[tuple[str, str]]:
    """tokenizer.ggml.merges as (left, right): split at the first space after the first character, as
    llama.cpp splits them."""
    merges = vocab.get("merges")
    if merges is None:
        raise ModelLoadError(f"{name}: a {vocab.get('model')!r} vocabulary without tokenizer.ggml.merges")
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        if cut < 0:
            raise ModelLoadError(f"{name}: malformed merge {merge!r} (no space between its two tokens)")
        pairs.append((merge[:cut], merge[cut + 1:]))
    return pairs


def _byte_level_bpe(vocab: dict, ids: dict, name: str) -> Tokenizer:
    regexes, ignore_merges = _PRE_TYPES[pre_tokenizer_type(vocab, name)]
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=_merge_pairs(vocab, name), ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _gemma4_bpe(vocab: dict, ids: dict, name: str) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=_merge_pairs(vocab, name), byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    tokenizer.decoder = _SPM_DECODER
    return tokenizer


def _sentencepiece_bpe(vocab: dict, tokens: list, types: list, ids: dict, name: str) -> Tokenizer:
    scores = vocab.get("scores")
    if scores is None or len(scores) != len(tokens):
        raise ModelLoadError(f"{name}: a 'llama' vocabulary needs one score per token (tokenizer.ggml.scores)")
    unk_id = vocab.get("unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=_merges_from_scores(tokens, scores, types, ids),
                                     unk_token=unk, fuse_unk=True, byte_fallback=True))
    add_prefix = vocab.get("add_space_prefix", True)  # llama.cpp's default for sentencepiece
    steps = [normalizers.Prepend("\u2581")] if add_prefix else []
    tokenizer.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "\u2581")])
    strip = [decoders.Strip(content=" ", left=1, right=0)] if add_prefix else []
    tokenizer.decoder = decoders.Sequence([_SPM_DECODER, *strip]) if strip else _SPM_DECODER
    return tokenizer


def _merges_from_scores(tokens: list, scores: list, types: list, ids: dict) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best merged-token score first.

    llama.cpp's sentencepiece loop merges the adjacent pair whose concatenation scores highest;
    ranking merges by that score makes BPE do the same. Ties go to the lower token id.
    """
    ranked = []
    for i, token in enumerate(tokens):
        # Control, byte and unknown tokens are reached whole (added tokens, byte fallback), never merged.
        if types[i] not in (NORMAL, USER_DEFINED, UNUSED) or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                ranked.append((-float(scores[i]), i, ids[left], (left, right)))
    ranked.sort()
    return [pair for *_, pair in ranked]
