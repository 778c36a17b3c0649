"""A rendered prompt shown read-only: special tokens marked, placeholders as the template
editor shows them, the static prefix shaded."""
from __future__ import annotations

import html
import re

from ..engine.prompts.template import Placeholder, Template
from .template_editor import PREFIX_SHADE

SPECIAL_STYLE = "color:#7b1fa2; font-weight:bold; background:#f3e5f5"
PLACEHOLDER_STYLE = "color:#0b5cad; font-weight:bold; background:#fff3c4"


def rendered_html(template: Template, specials: list[str]) -> str:
    """The rendered prompt: special tokens marked, placeholders as in the editor, the static
    prefix shaded."""
    rx = re.compile("|".join(re.escape(s) for s in specials)) if specials else None
    out, in_prefix = [], True
    for part in template.parts:
        if isinstance(part, Placeholder):
            in_prefix = False
            out.append(f'<span style="{PLACEHOLDER_STYLE}">'
                       f"&lt;{html.escape(part.name)}&gt;</span>")
            continue
        shade = f' style="background:{PREFIX_SHADE.name()}"' if in_prefix else ""
        pos, pieces = 0, []
        for m in rx.finditer(part.text) if rx else ():
            pieces.append(html.escape(part.text[pos:m.start()]))
            pieces.append(f'<span style="{SPECIAL_STYLE}">'
                          f"{html.escape(m.group())}</span>")
            pos = m.end()
        pieces.append(html.escape(part.text[pos:]))
        out.append(f"<span{shade}>{''.join(pieces)}</span>")
    return ('<pre style="white-space:pre-wrap; font-family:\'DejaVu Sans Mono\',monospace">'
            + "".join(out) + "</pre>")
