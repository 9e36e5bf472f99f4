"""Build ``service/data/word_freq.tsv.gz``, the word and character frequencies the default
detector reads, from the ``wordfreq`` package (its data: CC BY-SA 4.0, see
``service/data/NOTICE.md``). Maintainers only; the service does not need wordfreq.

    pip install wordfreq==3.1.1 && python -m service.tools.build_word_data
"""

from __future__ import annotations

import gzip
import math
import os
import re
from collections import defaultdict
from pathlib import Path

# Its lines, tab-separated:
# - ``words <lang> <word>:<zipf×10> ...``: the TOP_WORDS most frequent words of each language
#   wordfreq has among those the detector tells apart within a shared script;
# - ``chars <lang> <char>:<zipf×10> ...``: how often each Han or Kana character is used in
#   Chinese (as Simplified) and Japanese, summed over TOP_CJK_WORDS words;
# - ``simplified <traditional><simplified>...``: wordfreq's Traditional-to-Simplified map, so
#   that Traditional text is read against the Chinese table.
OUT = Path(__file__).resolve().parent.parent / "data" / "word_freq.tsv.gz"
TOP_WORDS = 12_000
TOP_CJK_WORDS = 60_000
# The detector's language -> wordfreq's
WORDFREQ_CODE = {"no": "nb", "tl": "fil", "hr": "sh"}
_LETTERS = re.compile(r"^[^\W\d_]+(?:['’][^\W\d_]+)?$")
_HAN_KANA = re.compile(r"[\u3041-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def main() -> None:
    import msgpack
    import wordfreq

    from service.text.detect import _SHARED

    lines = []
    for script in ("Latn", "Cyrl"):
        for lang in _SHARED[script]:
            code = WORDFREQ_CODE.get(lang, lang)
            if code not in wordfreq.available_languages():
                continue
            freqs = wordfreq.get_frequency_dict(code)
            words = [w for w in sorted(freqs, key=lambda w: -freqs[w]) if _LETTERS.match(w)]
            cells = [f"{w}:{round((math.log10(freqs[w]) + 9) * 10)}" for w in words[:TOP_WORDS]]
            lines.append("\t".join(["words", lang, *cells]))
    for lang in ("zh", "ja"):
        weight: dict[str, float] = defaultdict(float)
        freqs = wordfreq.get_frequency_dict(lang)
        for word in sorted(freqs, key=lambda w: -freqs[w])[:TOP_CJK_WORDS]:
            freq = freqs[word]
            for ch in word:
                if _HAN_KANA.match(ch):
                    weight[ch] += freq
        total = sum(weight.values())
        cells = [f"{ch}:{round((math.log10(w / total) + 9) * 10)}"
                 for ch, w in sorted(weight.items(), key=lambda kv: -kv[1]) if w > 0]
        lines.append("\t".join(["chars", lang, *cells]))
    path = os.path.join(os.path.dirname(wordfreq.__file__), "data", "_chinese_mapping.msgpack.gz")
    with gzip.open(path) as f:
        mapping = msgpack.load(f, raw=False, strict_map_key=False)
    simple = {chr(k): chr(v) if isinstance(v, int) else v for k, v in mapping.items()}
    pairs = "".join(trad + simp for trad, simp in sorted(simple.items())
                    if len(simp) == 1 and simp != trad)
    lines.append("\t".join(["simplified", pairs]))
    with gzip.open(OUT, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(lines)} lines)")


if __name__ == "__main__":
    main()
