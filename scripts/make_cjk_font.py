"""Build the Chinese font that ships with the package (src/transformer_course/fonts/).

Every figure of the book draws Chinese labels with this one file, so the glyphs and their
metrics are the same on Linux, macOS and Windows, with no system font and no apt step.

Source: the Simplified-Chinese face of Noto Sans CJK Regular (SIL Open Font License 1.1),
e.g. Debian's ``fonts-noto-cjk`` (``apt-get download fonts-noto-cjk`` and unpack it with
``dpkg-deb -x``), the file ``NotoSansCJK-Regular.ttc``. The script

1. takes the SC face out of the collection,
2. keeps only the characters a figure can need: ASCII, Latin-1, Greek, punctuation, arrows and
   mathematical operators, the 6,763 Chinese characters of GB 2312, and every character that
   appears in ``book/`` and in the package's text corpora,
3. converts the cubic (CFF) outlines to TrueType quadratic ones, which every matplotlib backend
   (PNG, SVG, PDF, PS) can embed,
4. renames the family to ``Course Sans SC`` (a modified version may not keep the original
   name's reserved part; a unique name also keeps a system copy of Noto from shadowing it).

Usage: python scripts/make_cjk_font.py path/to/NotoSansCJK-Regular.ttc
"""

from __future__ import annotations

import argparse
import pathlib

from fontTools.pens.cu2quPen import Cu2QuPen
from fontTools.pens.ttGlyphPen import TTGlyphPen
from fontTools.subset import Options, Subsetter
from fontTools.ttLib import TTCollection, newTable

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "transformer_course" / "fonts" / "CourseSansSC-Regular.ttf"
FAMILY = "Course Sans SC"
RANGES = [
    (0x20, 0x7E),
    (0xA0, 0xFF),
    (0x370, 0x3FF),  # Greek
    (0x2000, 0x206F),  # general punctuation
    (0x2100, 0x22FF),  # letterlike symbols, number forms, arrows, mathematical operators
    (0x2460, 0x24FF),  # enclosed numbers
    (0x2500, 0x25FF),  # box drawing, block elements, geometric shapes
    (0x2600, 0x27BF),  # symbols, dingbats (★, ✓)
    (0x3000, 0x303F),  # CJK symbols and punctuation
    (0xFF00, 0xFFEF),  # full-width forms
]


def gb2312_hanzi() -> set[int]:
    """The Chinese characters of GB 2312 (rows 16-87)."""
    chars = set()
    for row in range(0xB0, 0xF8):
        for cell in range(0xA1, 0xFF):
            try:
                chars.add(ord(bytes([row, cell]).decode("gb2312")))
            except UnicodeDecodeError:
                continue
    return chars


def project_characters() -> set[int]:
    paths = list((ROOT / "book").rglob("*.md")) + list((ROOT / "src").rglob("*.txt"))
    return {ord(ch) for path in paths for ch in path.read_text(encoding="utf-8") if ord(ch) >= 0x80}


def to_truetype(font) -> None:
    """Replace the CFF table by glyf/loca with quadratic outlines (max error 1 unit)."""
    glyph_set = font.getGlyphSet()
    glyf = newTable("glyf")
    glyf.glyphOrder = font.getGlyphOrder()
    glyf.glyphs = {}
    for name in glyf.glyphOrder:
        pen = TTGlyphPen(glyph_set)
        glyph_set[name].draw(Cu2QuPen(pen, max_err=1.0, reverse_direction=True))
        glyf.glyphs[name] = pen.glyph()
    del font["CFF "]
    font["glyf"] = glyf
    font["loca"] = newTable("loca")
    font["maxp"].tableVersion = 0x00010000
    for attr in (
        "maxZones",
        "maxTwilightPoints",
        "maxStorage",
        "maxFunctionDefs",
        "maxInstructionDefs",
        "maxStackElements",
        "maxSizeOfInstructions",
        "maxComponentElements",
    ):
        setattr(font["maxp"], attr, 0)
    font["maxp"].maxZones = 1
    font["head"].glyphDataFormat = 0
    post = font["post"]
    post.formatType = 2.0
    post.extraNames = []
    post.mapping = {}
    post.glyphOrder = font.getGlyphOrder()
    font.sfntVersion = "\x00\x01\x00\x00"


def rename(font) -> None:
    names = {
        1: FAMILY,
        2: "Regular",
        3: f"{FAMILY} Regular; subset of Noto Sans CJK SC",
        4: f"{FAMILY} Regular",
        6: FAMILY.replace(" ", "") + "-Regular",
        16: FAMILY,
        17: "Regular",
    }
    table = font["name"]
    table.names = [n for n in table.names if n.nameID not in names and n.nameID not in (18, 21, 22)]
    for name_id, text in names.items():
        table.setName(text, name_id, 3, 1, 0x409)
        table.setName(text, name_id, 1, 0, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ttc", type=pathlib.Path, help="NotoSansCJK-Regular.ttc")
    args = parser.parse_args()
    fonts = TTCollection(str(args.ttc)).fonts
    font = next(f for f in fonts if f["name"].getDebugName(1) == "Noto Sans CJK SC")
    unicodes = {c for lo, hi in RANGES for c in range(lo, hi + 1)} | gb2312_hanzi() | project_characters()
    options = Options()
    options.layout_features = []
    options.name_IDs = ["*"]
    options.notdef_outline = True
    options.hinting = False
    options.desubroutinize = True
    subsetter = Subsetter(options)
    subsetter.populate(unicodes=unicodes)
    subsetter.subset(font)
    to_truetype(font)
    rename(font)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    font.save(str(OUT))
    print(f"{OUT.relative_to(ROOT)}: {len(font.getGlyphOrder())} glyphs, {OUT.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
