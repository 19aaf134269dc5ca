"""Hard strings for the tokenizer parity tests, shared by ``tests/test_tokenizer.py`` and
``tools/llamacpp_fixtures/make_tokenizer_fixtures.py`` (the fixtures store each string beside llama.cpp's
ids, and the test checks they still agree).

Scripts, emoji sequences, combining marks, whitespace runs, code, numbers, URLs, text that looks like
special tokens (whole, partial, nested), control characters and unusual code points, long runs.
"""

from __future__ import annotations

# (add_special, parse_special) modes recorded for every string, in this order
MODES: tuple[tuple[bool, bool], ...] = ((True, True), (False, False), (False, True))

_SCRIPTS = [
    "我爱自然语言处理。今天天气很好！",
    "こんにちは、世界！カタカナとひらがなと漢字。",
    "안녕하세요 세계, 한국어 텍스트입니다.",
    "مرحبا بالعالم، هذا نص عربي.",
    "שלום עולם, זה טקסט בעברית.",
    "नमस्ते दुनिया, यह हिंदी पाठ है।",
    "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "Բարեւ աշխարհ",
    "გამარჯობა მსოფლიო",
    "வணக்கம் உலகம்",
    "ওহে বিশ্ব",
    "ሰላም ልዑል",
    "Tiếng Việt có dấu: Xin chào thế giới",
    "İstanbul'da ıstakoz, ǅemal, straße, STRASSE, ẞ",
    "mixed: English, 中文, русский, العربية, ελληνικά, 日本語 in one line",
]

_EMOJI = [
    "😀",
    "😀😃😄😁😆",
    "👨‍👩‍👧‍👦 family",
    "🇺🇸🇯🇵🇩🇪 flags",
    "👍🏽👍🏿",
    "❤️ and ❤",
    "🏳️‍🌈 🏴‍☠️",
    "1️⃣ 2️⃣ #️⃣",
    "🧑🏾‍💻 coding",
    "emoji at the end 🚀",
    "🦀🐍☕",
]

_MARKS = [
    "e\u0301 vs \u00e9",
    "a\u0308\u0304 o\u0323\u0302",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O",
    "\u0915\u094d\u0937 \u0924\u094d\u0930",
    "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd",
    "\u0300 leading combining mark",
]

_WHITESPACE = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    " " * 40,
    "\n" * 70,
    "\t" * 35,
    "  leading and trailing  ",
    " \t\n \t\n\n \r\n  ",
    "a\n\nb\n\n\nc",
    "line1\r\nline2\r\nline3",
    "word   word    word\t\tword",
    "tab\tseparated\tvalues\n1\t2\t3",
    "trailing newline\n",
    "\n\nleading newlines",
    "no\u00a0break\u00a0space and\u3000ideographic\u2028line\u2029para\u0085nel",
    " \n " * 10,
]

_CODE = [
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    '#include <stdio.h>\nint main(void) {\n\tprintf("hello, %s!\\n", "world");\n\treturn 0;\n}\n',
    "const add = (a, b) => a + b; // arrow\nconsole.log(`sum=${add(1, 2)}`);",
    'fn main() {\n    let v: Vec<u8> = vec![1, 2, 3];\n    println!("{:?}", v);\n}',
    '<div class="x"><h1>Title</h1><p>Para <b>bold</b> <i>it</i></p></div>',
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    'for f in *.txt; do echo "$f" | tr a-z A-Z >> out.log; done',
    "\\begin{equation} E = mc^2 \\quad \\int_0^\\infty e^{-x^2} dx \\end{equation}",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b<<=1;c>>=2;d&&=e||f",
    "    indented\n        more\n\t\ttabs\n",
]

_NUMBERS = [
    "1",
    "12",
    "123",
    "1234",
    "12345",
    "1234567",
    "12345678901234567890",
    "3.14159265358979",
    "-42 +17 ±3",
    "1,000,000 and 1.000.000",
    "0x1F 0b1010 0o777 1e-10 6.02e23",
    "١٢٣٤ ०१२३ １２３ ½ ⅓ Ⅻ ²³",
    "phone: +1 (555) 123-4567",
    "2024-01-15T12:34:56Z",
]

_URLS = [
    "https://example.com/path?query=1&b=two#frag",
    "http://user:pass@sub.domain.co.uk:8080/a/b/c.html",
    "mailto:someone@example.org",
    "ftp://files.example.net/pub/file_v1.2.3.tar.gz",
    "www.example.com/über/straße?q=naïve",
]

_SPECIAL_LOOKING = [
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<bos>",
    "<bos><bos>",
    "<eos>",
    "<pad><unk><mask>",
    "<|im_",
    "<|im_start",
    "<start_of_tu",
    "<<|im_start|>>",
    "<|im_start|><|im_start|>",
    "</s>",
    "<s>",
    "<unused0> <unused6241>",
    "[multimodal]",
    "<start_of_image><end_of_image>",
    "<tool_call>{}</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<0x41><0xZZ><0x00>",
    "\u2581 literal sentencepiece space \u2581\u2581x",
    "\u0120 byte-level space \u010a",
    "<h1>Title</h1>\n\n<table><tr><td>1</td></tr></table>",
]

_PUNCTUATION = [
    "don't I'M you're we've they'll she'd it's",
    "'s 'S 'll 'LL 'ſ",
    "Hello ' world ' ' '",
    "Wait . . . what , ok ! really ?",
    "a ?b !c .d ,e",
    '"quoted" «guillemets» „German“ 「Japanese」',
    "...!!!???---___***",
    "C'est l'été, n'est-ce pas?",
]

_CONTROL = [
    "\x00",
    "a\x00b",
    "\x01\x02\x03\x1f\x7f",
    "zero\u200bwidth\u200cjoiner\u200dhere",
    "\ufeffBOM at start",
    "\ufffd replacement \ufffd\ufffd",
    "\ufffe\uffff noncharacters",
    "\U0010ffff max code point",
    "\ue000\uf8ff private use \U000f0000",
    "\u0378 unassigned",
    "!!\U000f0000!!",
    "\u202eright-to-left override\u202c",
    "\x1b[31mred\x1b[0m",
]

_LONG = [
    "a" * 1000,
    "ab" * 300,
    "supercalifragilisticexpialidocious" * 10,
    "😀" * 50,
    "漢" * 200,
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "-" * 80,
    "=" * 33 + "\n" + "#" * 17,
    "The quick brown fox jumps over the lazy dog. " * 8,
]

CORPUS: list[str] = [
    *_SCRIPTS,
    *_EMOJI,
    *_MARKS,
    *_WHITESPACE,
    *_CODE,
    *_NUMBERS,
    *_URLS,
    *_SPECIAL_LOOKING,
    *_PUNCTUATION,
    *_CONTROL,
    *_LONG,
]

# Strings whose characters span several tokens (emoji missing from Gemma's vocabulary go through byte
# fallback; rare CJK characters are several byte-level pieces in Qwen's), for the streaming tests.
MULTIBYTE: list[str] = [
    "weather \U0001f301\U0001f322\U0001f394 money \U0001f4b7\U0001f4c7\U0001f500!",
    "\u4e02\u4e04\u4e05 \u4e40\u4e41 \U00020000\U00020001 \u6f22\u5b57",
    "\u0b86 \u1230 \u141b \U0001d539 \U0010ffff \ue000 done",
    "e\u0301\u0302\u0303 \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f3f1",
]

# Characters new in Unicode 16.0 next to punctuation. llama.cpp's Unicode tables predate 16.0 and class
# them as unassigned; the regex engine of Hugging Face tokenizers (which regolith runs) knows them as
# letters, so the BPE pre-tokenizer splits the text differently. The qwen2 fixture records llama.cpp's ids
# and those of transformers' tokenizer for the same GGUF; regolith follows transformers.
UNICODE16: list[str] = ["?\U00013ccd[x", "?\u1c89[x"]

# Fixture name -> (known model, metadata overrides). The overrides give llama.cpp's other settings on
# the same vocabularies: a space prefix and an added EOS (SPM), and the other BPE pre-tokenizers.
VARIANTS: dict[str, tuple[str, dict[str, str | bool]]] = {
    "gemma3": ("gemma3-270m", {}),
    "qwen2": ("qwen2.5-coder-0.5b", {}),
    "gemma3-space-prefix": (
        "gemma3-270m",
        {"tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.add_eos_token": True},
    ),
    "qwen2-pre-gpt2": ("qwen2.5-coder-0.5b", {"tokenizer.ggml.pre": "gpt-2"}),
    "qwen2-pre-llama3": ("qwen2.5-coder-0.5b", {"tokenizer.ggml.pre": "llama-bpe"}),
    "qwen2-pre-default": ("qwen2.5-coder-0.5b", {"tokenizer.ggml.pre": "default"}),
    "qwen2-pre-qwen35": ("qwen2.5-coder-0.5b", {"tokenizer.ggml.pre": "qwen35"}),
    "qwen2-pre-gpt4o": ("qwen2.5-coder-0.5b", {"tokenizer.ggml.pre": "gpt-4o"}),
}
