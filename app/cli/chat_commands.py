"""`kvprimer render`: a template as the model will read it: the prompt text (a chat template
rendered with the model's own chat template) and its tokens, special tokens marked."""
from __future__ import annotations

import argparse

from ..engine.llama.model_files import check_gguf_file, default_model_path
from ..engine.llama.native_model import NativeModel
from ..engine.prompts.prompt_tokens import PromptTokenizer
from ..engine.prompts.template import Placeholder
from .engine_options import read_template
from .exit_codes import ExitCode
from .output import emit
from .run_commands import _values


def render_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template", help="a template: .tmpl, a chat template (.json, .yaml) or a "
                                    "project (.kvproj)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a placeholder's value (without values: the static prefix's tokens)")
    p.add_argument("--set-file", action="append", default=[], metavar="NAME=PATH",
                   help="a value read from a file")


def cmd_render(args) -> int:
    tpl = read_template(args.template, args.model)
    values = _values(args)
    filled = tpl.fill(values) if values or not tpl.placeholders else None
    model = NativeModel(check_gguf_file(args.model or default_model_path()))
    try:
        tokenizer = PromptTokenizer(model)
        special = {t for _text, t in model.control_tokens()}
        bos = model.bos()
        if bos is not None:
            special.add(bos)
        tokens = tokenizer.tokenize(filled or tpl.prefix_prompt())
        prefix = len(tokenizer.tokenize(tpl.prefix_prompt()))
        pieces = [model.piece(t).decode("utf-8", "replace") for t in tokens]
    finally:
        model.close()
    # without values the prompt is shown with its placeholders, and its tokens stop at them
    text = filled.text if filled else "".join(
        f"<{p.name}>" if isinstance(p, Placeholder) else p.text for p in tpl.parts)
    data = {"prompt": text, "filled": filled is not None, "static_prefix_tokens": prefix,
            "tokens": [{"id": t, "text": p, "special": t in special}
                       for t, p in zip(tokens, pieces)]}

    def words():
        print(text)
        print("---")
        what = "tokens" if filled else "tokens of the static prefix (give --set for the rest)"
        print(f"{len(tokens)} {what}; static prefix {prefix} tokens; special tokens in ⟦ ⟧")
        print("".join(f"⟦{p}⟧" if t in special else p for t, p in zip(tokens, pieces)))
        print(" ".join(str(t) for t in tokens))

    emit(args, data, words)
    return ExitCode.OK
