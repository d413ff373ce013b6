// The hand-written hard cases for the tokenizer parity test (tests/ref/tok_ref.mjs writes the
// reference ids for them). Each case: [name, text]. Texts are JS strings, written to the
// reference file as UTF-8 bytes. (Every code point, one by one, is covered by
// tests/test_tok_unicode.c.)

// A deterministic pseudo-random string over an alphabet (an LCG, so the case never changes).
function randomWord(alphabet, n, seed) {
  const chars = Array.from(alphabet);
  let x = seed >>> 0;
  let s = '';
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    s += chars[(x >>> 8) % chars.length];
  }
  return s;
}

// The C0 controls, U+0000..U+001F, one string each.
const c0 = Array.from({ length: 32 }, (_, i) => String.fromCharCode(i));

export const cases = [
  ['empty', ''],
  ['hello', 'Hello, world!'],
  ['sentence', 'The quick brown fox jumps over the lazy dog.'],

  // Scripts.
  ['chinese', '你好，世界！今天天气很好。我们去公园散步吧。'],
  ['japanese', 'こんにちは世界。カタカナとひらがなと漢字を混ぜた文です。'],
  ['korean', '안녕하세요 세계! 한국어 문장입니다.'],
  ['arabic', 'مرحبا بالعالم، هذه جملة عربية.'],
  ['hebrew', 'שלום עולם, זה משפט בעברית.'],
  ['hindi', 'नमस्ते दुनिया, यह हिंदी वाक्य है।'],
  ['bengali', 'ওহে বিশ্ব, এটি একটি বাংলা বাক্য।'],
  ['tamil', 'வணக்கம் உலகம், இது தமிழ் வாக்கியம்.'],
  ['telugu', 'హలో ప్రపంచం'],
  ['thai', 'สวัสดีชาวโลก นี่คือประโยคภาษาไทย'],
  ['lao', 'ສະບາຍດີຊາວໂລກ'],
  ['khmer_zwsp', 'សួស្តី\u200bពិភពលោក'],
  ['myanmar', 'မင်္ဂလာပါ ကမ္ဘာလောက'],
  ['tibetan', 'བཀྲ་ཤིས་བདེ་ལེགས།'],
  ['sinhala', 'ආයුබෝවන් ලෝකය'],
  ['russian', 'Привет, мир! Съешь же ещё этих мягких французских булок.'],
  ['ukrainian', 'Ґанок, їжак, Єва'],
  ['greek', 'Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.'],
  ['armenian', 'Բարեւ աշխարհ'],
  ['georgian', 'გამარჯობა მსოფლიო'],
  ['amharic', 'ሰላም ልዑል ዓለም'],
  ['cherokee', 'ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ'],
  ['syriac', 'ܫܠܡܐ ܥܠܡܐ'],
  ['thaana', 'ހެލޯ ވޯލްޑް'],
  ['nko', 'ߒߞߏ ߞߊ߲ߜߍ'],
  ['vietnamese', 'Xin chào thế giới, Tiếng Việt có dấu.'],
  ['turkish', 'İstanbul ıIiİ ŞşĞğ'],
  ['german', 'Straße ÄÖÜäöü ẞ Größe'],
  ['polish', 'Zażółć gęślą jaźń'],
  ['icelandic', 'Þorsteinn Ðóra æðislegt'],
  ['yoruba', 'Ẹ ku àárọ̀, ọmọ mi'],
  ['mongolian', 'ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ᠌'],
  ['fullwidth', 'ＡＢＣａｂｃ１２３！？'],
  ['math_alnum', '𝐀𝐁𝐂 𝑥𝑦𝑧 𝟏𝟐𝟑 𝔸𝔹ℂ'],
  ['gothic_old_italic', '𐌰𐌱𐌲 𐌀𐌁𐌂'],
  ['cuneiform_hieroglyph', '𒀀𒀁𒀂 𓀀𓀁𓀂'],
  ['cjk_ext_b', '𠀀𠀁𠀂 𪜀'],
  ['braille', '⠓⠑⠇⠇⠕ ⠺⠕⠗⠇⠙'],
  ['other_digits', '١٢٣ ۴۵۶ १२३ ৪৫৬ ๑๒๓ ၁၂၃'],
  ['number_forms', 'Ⅻ ⅻ ½ ¾ ² ³ ⁴ ₅ ①②③'],
  ['mixed_scripts', 'Hello世界123abcПривет456مرحبا'],

  // Emoji.
  ['emoji', '👍'],
  ['emoji_skin', '👍🏽 👋🏿 🧑🏻‍🦰'],
  ['emoji_zwj_family', '👨‍👩‍👧‍👦'],
  ['emoji_rainbow_flag', '🏳️‍🌈'],
  ['emoji_coder', '🧑🏿‍💻 👩🏼‍🔬'],
  ['emoji_flags', '🇯🇵🇺🇸🇩🇪 🏴󠁧󠁢󠁳󠁣󠁴󠁿'],
  ['emoji_keycap', '1️⃣ #️⃣ *️⃣'],
  ['emoji_heart_fire', '❤️‍🔥 ❤️ ♥'],
  ['emoji_in_text', 'I ❤️ NY 🗽!! Great job 👏👏👏 see you 🔜'],

  // Combining marks that NFC changes.
  ['nfc_e_acute', 'e\u0301te\u0301'],
  ['nfc_a_ring', 'A\u030A and \u212B (angstrom) and \u00C5'],
  ['nfc_reorder', 'a\u0301\u0327 o\u0308\u0304 \u1E9B\u0323 q\u0307\u0323'],
  ['nfc_hangul_jamo', '\u1100\u1161\u11A8 \u1112\u1161\u11AB\u1100\u1173\u11AF'],
  ['nfc_exclusions', '\u0958 \uFB2A \u0344 \u2126 \u0340\u0341 \u0F73'],
  ['nfc_stacked', 'Z\u0351\u036B\u0343\u036A\u0302\u036B\u033D\u034F\u0334\u0319\u0324\u031E'],
  ['nfc_vietnamese_decomposed', 'Tie\u0302\u0301ng Vie\u0323\u0302t'],
  ['nfc_unchanged_ligature', 'ﬁ ﬂ ǅ ㎏ ™'],
  ['nfc_after_space', ' \u0301 \u0301\u0301 x\n\u0308'],

  // Whitespace.
  ['spaces_two', 'a  b'],
  ['spaces_many', 'a          b'],
  ['spaces_leading', '   leading'],
  ['spaces_trailing', 'trailing   '],
  ['spaces_only', '     '],
  ['tabs', '\t\ttabs\tand\t\tmore\t'],
  ['newlines', 'line1\nline2\n\nline4\n\n\n'],
  ['crlf', 'line1\r\nline2\r\n\r\nend\r\n'],
  ['lone_cr', 'lone\rcr\r\rx'],
  ['mixed_ws', 'a \t\n b\n \n\t c  \r\n  d'],
  ['ws_before_word', '   \n\n  x'],
  ['trailing_newline_space', 'x \n'],
  ['only_newlines', '\n\n\n'],
  ['cr_only', '\r'],
  ['cr_cr_lf_lf', '\r\r\n\n'],
  ['indent', 'def f():\n    if x:\n        return 1\n    return 2\n'],
  ['unicode_spaces', 'a\u00A0b\u2003c\u3000d\u2009e\u202Ff\u205Fg\u1680h'],
  ['line_separators', 'a\u2028b\u2029c\u0085d'],
  ['vt_ff', 'a\u000Bb\u000Cc'],
  ['zero_width', 'a\u200Bb\u200Cc\u200Dd\u2060e'],
  ['bom', '\uFEFFbom at start and\uFEFFinside'],
  // Where the JS port's \s (JavaScript's) differs from HF's (Unicode White_Space): U+0085 is
  // whitespace, U+FEFF is not. The "|x" glue makes the difference visible in the ids.
  ['nel_context', "|x\u0085x \u00851\u0085\n'\u0085|"],
  ['bom_context', "|x\uFEFFx \uFEFF1\uFEFF\n'\uFEFF|"],
  ['mongolian_vowel_sep', 'a\u180Eb \u180E x \u180E1 x\u180Ex'],

  // Contractions (the regex's case-insensitive group).
  ['contractions_lower', "I'm you're we've he'll she'd it's don't"],
  ['contractions_upper', "I'M YOU'RE WE'VE HE'LL SHE'D IT'S DON'T"],
  ['contractions_mixed', "It'S We'Ve they'RE I'lL"],
  ['contractions_alone', "'s 't 're 've 'm 'll 'd 'S"],
  ['apostrophes', "y'all rock'n'roll ''s ''' '' ' o'clock"],
  ['curly_apostrophe', 'don\u2019t it\u2019s \u2018quoted\u2019'],
  ['long_s', "it'\u017F it'\u017Ft '\u017F"],
  ['kelvin', "'\u212A K \u212A"],

  // Digits.
  ['digits', '1234567890'],
  ['decimals', '3.14159 2.71828 -0.5 1e-10 6.02e23'],
  ['thousands', '1,000,000 and 1 000 000 and 1_000_000'],
  ['ordinals', '1st 2nd 3rd 4th 21st'],
  ['hex', '0x1F 0xDEADBEEF #ff00aa'],
  ['fullwidth_digits', '２０２４年１２月'],
  ['dates', '2024-01-15T10:30:00Z 12/31/1999'],

  // Code.
  ['python', 'import os\n\ndef main(argv):\n    """Doc."""\n    for i in range(10):\n        print(f"{i:02d}", end="")\n    return {k: v for k, v in os.environ.items()}\n'],
  ['c_code', '#include <stdio.h>\nint main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0; // done\n}\n'],
  ['json', '{"key": "value", "n": [1, 2.5, -3e4], "ok": true, "none": null}'],
  ['html', '<!DOCTYPE html><html><body class="x">&amp; &lt;tag&gt;</body></html>'],
  ['shell', 'for f in *.txt; do\n  grep -E "^a.*b$" "$f" | wc -l >> out.log 2>&1\ndone'],
  ['regex', '^(?:[a-z0-9!#$%&\'*+/=?^_`{|}~-]+)@\\w+\\.\\w{2,}$'],
  ['markdown', '# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n* item\n* **bold** _it_ `code`'],
  ['identifiers', 'camelCase PascalCase snake_case SCREAMING_CASE kebab-case __dunder__'],

  // URLs, paths, addresses.
  ['url', 'https://example.com/path/to/page?query=1&b=two#frag'],
  ['url_unicode', 'https://例え.jp/パス?q=日本語'],
  ['email', 'mailto:someone.else+tag@example.org'],
  ['windows_path', 'C:\\Windows\\System32\\drivers\\etc\\hosts'],
  ['unix_path', '/usr/local/lib/python3.11/site-packages/~user/.config'],

  // Added tokens inside text.
  ['chatml', '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n'],
  ['endoftext', 'doc one<|endoftext|>doc two<|endoftext|>'],
  ['special_glued', 'a<|endoftext|>b<|im_end|><|im_end|>c'],
  ['special_partial', '<|im_start <|im_end| <|endoftext |> <|> <||>'],
  ['special_nested', '<<|im_end|>> <|<|im_start|>|>'],
  ['special_case', '<|IM_END|> <|Im_End|> <|endofText|>'],
  ['think', '<think>\nLet me reason.\n</think>\n\nThe answer is 4.'],
  ['tool_call', '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'],
  ['fim', '<|fim_prefix|>def add(a, b):<|fim_suffix|>\n<|fim_middle|>    return a + b'],
  ['vision', '<|vision_start|><|image_pad|><|image_pad|><|vision_end|>describe'],
  ['special_spaces', ' <|im_end|> \n<|endoftext|>\n\n'],

  // Punctuation and symbols.
  ['punct_runs', '!!!???... ---- ____ ==== ;;;'],
  ['dashes_quotes', '— – - « » “smart” ‘single’ „low“'],
  ['symbols', '© ® ™ ° € £ ¥ § ¶ † ‡ • … ‰ ′ ″'],
  ['math', '∀x∈ℝ: x² ≥ 0 ∧ ∑ᵢ aᵢ ≤ ∞ ≠ ≈ √2 ∫f(x)dx'],
  ['box_drawing', '┌──┐\n│ok│\n└──┘'],
  ['ascii_art', '  /\\_/\\\n ( o.o )\n  > ^ <'],

  // Controls and odd code points.
  ['controls', 'a\u0001b\u0002c\u001Fd\u007Fe\u0080f\u009F'],
  ['nul', 'before\u0000after\u0000'],
  // Every C0 control (U+0000..U+001F) and DEL: between letters, after a space, in runs, and
  // next to what the Split regex and NFC treat apart (digits, contractions, whitespace, marks).
  ['c0_between_letters', 'a' + c0.map((c) => c + 'b').join('')],
  ['c0_after_space', c0.map((c) => ' ' + c).join('') + ' \u007F'],
  ['c0_runs', c0.join('') + 'x' + c0.join('') + c0.join('') + '\u007F\u007F'],
  ['c0_with_whitespace', c0.map((c) => c + ' \t\n' + c + '\r\n').join('')],
  ['c0_with_digits', c0.map((c) => '1' + c + '23' + c).join('')],
  ['c0_contractions', c0.map((c) => "it" + c + "'s " + c + "'ll").join(' ')],
  ['nul_contexts', '\u0000lead trail\u0000 \u0000\u0000 x\u0000\u0000y 12\u00003 é\u0000é ' +
                   'e\u0000\u0301 \u0000\u0301 \u0000中文\u0000 😀\u0000😀'],
  ['nul_added_tokens', '\u0000<|endoftext|>\u0000<|im_end|>\u0000<|im_start|>\u0000'],
  ['nul_only', '\u0000'],
  ['nul_long_run', '\u0000'.repeat(300) + 'a' + '\u0000'.repeat(3)],
  ['replacement_char', 'bad \uFFFD char \uFFFD\uFFFD'],
  ['private_use', '\uE000\uF8FF \u{F0000} \u{10FFFD}'],
  ['noncharacters', '\uFFFE\uFFFF \uFDD0 \u{1FFFF} \u{10FFFF}'],
  ['tags_variation', 'a\u{E0041}\u{E007F} \uFE0F\uFE0E \u{E0100}'],
  ['unassigned', '\u0378 \u{50000} \u{2FFFF} \u{E0080}'],
  ['rtl_marks', '\u202Eabc\u202C \u200F\u200E x'],

  // Long inputs.
  ['long_word_100k', randomWord('abcdefghijklmnopqrstuvwxyz', 100000, 12345)],
  ['long_word_repeat', 'ab'.repeat(20000)],
  ['long_same_letter', 'a'.repeat(30000)],
  ['long_digits', randomWord('0123456789', 10000, 7)],
  ['long_spaces', ' '.repeat(5000) + 'x' + ' '.repeat(5000)],
  ['long_cjk', randomWord('的一是不了人我在有他这为之大来以个中上们', 20000, 99)],
  ['long_punct', randomWord('!?.,;:-_=+*/', 20000, 3)],

];
