"""Chat templates (messages in JSON or YAML) rendered with a model's own chat template, on
tiny models that carry the chat templates of other families; the comparison with llama-server
itself is in test_chat_server.py."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.engine import Engine, EngineConfig, GenerationConfig, run_prompt
from app.engine.errors import ChatTemplateError, MissingValuesError, TemplateSyntaxError
from app.engine.prompts.chat_format import CHATML_SOURCE, read_chat_format
from app.engine.prompts.chat_messages import ChatMessage, ChatTemplate, is_chat_file
from app.engine.prompts.chat_render import render_chat, render_chat_file, render_messages
from app.engine.prompts.template import Template
from tests.chat_templates import FAMILIES, WEATHER_TOOL
from tests.tiny_model import write_tiny_model

CHAT = ChatTemplate((ChatMessage("system", "You answer in one short sentence."),
                     ChatMessage("user", "What is the capital of France?"),
                     ChatMessage("assistant", "Paris."),
                     ChatMessage("user", "Context: <context>\nQuestion: <question>")))
VALUES = {"context": "the world is a question", "question": "hello?"}
# a template without a system role, which refuses one (as Gemma 2's does)
NO_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}"
             "{{ raise_exception('System role not supported') }}{% endif %}"
             "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def family_models(tmp_path_factory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("chat-models")
    models = {k: write_tiny_model(d / f"{k}.gguf", chat_template=v) for k, v in FAMILIES.items()}
    models["none"] = write_tiny_model(d / "none.gguf")
    models["no-system"] = write_tiny_model(d / "no-system.gguf", chat_template=NO_SYSTEM)
    return models


# -- the file --------------------------------------------------------------------------------

def test_json_and_yaml_read_the_same_messages_and_save_round_trips(tmp_path):
    for name in ("c.json", "c.yaml", "c.yml"):
        CHAT.save(tmp_path / name)
        assert is_chat_file(tmp_path / name)
        assert ChatTemplate.load(tmp_path / name) == CHAT
    assert json.loads((tmp_path / "c.json").read_text())[3]["content"] == CHAT.messages[3].content
    assert CHAT.placeholders == ["context", "question"]


def test_an_object_with_tools_keeps_them(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "Weather in <city>?"}],
                             "tools": [WEATHER_TOOL]}))
    chat = ChatTemplate.load(p)
    assert chat.tools == (WEATHER_TOOL,) and chat.placeholders == ["city"]
    chat.save(tmp_path / "again.yaml")
    assert ChatTemplate.load(tmp_path / "again.yaml") == chat


@pytest.mark.parametrize("text, words", [
    ('[{"role": "user"', "line 1, column 17: not valid JSON"),
    ('{"turns": []}', "unknown key 'turns'"),
    ('{"tools": []}', "has no 'messages'"),
    ('[]', "has no messages"),
    ('"hello"', "must be a list"),
    ('[{"role": "user", "content": 3}]', "message 1's content is not text"),
    ('[{"content": "hi"}]', "message 1 has no role"),
    ('[{"role": "narrator", "content": "hi"}]', "message 1 has the role 'narrator'"),
    ('[{"role": "user", "content": "hi", "name": "x"}]', "unknown key 'name'"),
    ('{"messages": [{"role": "user", "content": "hi"}], "tools": "all"}', "'tools' must be a list"),
])
def test_bad_files_are_refused_in_one_line(tmp_path, text, words):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(ChatTemplateError) as e:
        ChatTemplate.load(p)
    assert words in str(e.value) and "\n" not in str(e.value) and "bad.json" in str(e.value)


def test_a_bad_placeholder_names_the_message_and_yaml_errors_their_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("- role: user\n  content: fine\n- role: user\n  content: 'Question: <q'\n")
    with pytest.raises(TemplateSyntaxError, match=r"bad.yaml message 2 line 1, column 11"):
        ChatTemplate.load(p)
    p.write_text("- role: user\n  content: [unclosed\n")
    with pytest.raises(ChatTemplateError, match=r"bad.yaml line 3, column 1: not valid YAML"):
        ChatTemplate.load(p)


def test_filled_messages_carry_the_values_and_refuse_missing_ones():
    msgs = CHAT.filled(VALUES)
    assert msgs[-1] == {"role": "user", "content": "Context: the world is a question\n"
                                                   "Question: hello?"}
    assert msgs[0] == {"role": "system", "content": "You answer in one short sentence."}
    with pytest.raises(MissingValuesError, match="missing values for <question>"):
        CHAT.filled({"context": "x"})


# -- rendering -------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama3", "gemma3", "qwen3", "none"])
def test_the_rendered_template_filled_equals_the_rendered_filled_messages(family_models, family):
    fmt = read_chat_format(family_models[family])
    tpl = render_chat(fmt, CHAT).template
    assert tpl.placeholders == ["context", "question"]
    whole = render_messages(fmt, CHAT.filled(VALUES))
    assert tpl.fill(VALUES).text == whole
    assert whole.startswith(tpl.static_prefix) and "Context: " in tpl.static_prefix
    # the rendered source reads back as the same template, as a .tmpl would
    assert Template.parse(tpl.source).parts == tpl.parts


def test_each_family_renders_its_own_markup(family_models):
    def prefix(family):
        return render_chat(read_chat_format(family_models[family]), CHAT).template.static_prefix

    assert prefix("llama3").startswith("<|start_header_id|>system<|end_header_id|>\n\n"
                                       "You answer in one short sentence.<|eot_id|>")
    # Gemma 3 has no system turn: its template puts the system text into the first user turn
    assert prefix("gemma3").startswith("<start_of_turn>user\nYou answer in one short sentence."
                                       "\n\nWhat is the capital of France?<end_of_turn>\n"
                                       "<start_of_turn>model\nParis.<end_of_turn>")
    assert prefix("qwen3").startswith("<|im_start|>system\nYou answer")
    assert render_messages(read_chat_format(family_models["qwen3"]),
                           CHAT.filled(VALUES)).endswith("<|im_start|>assistant\n")


def test_a_leading_bos_is_left_to_the_tokenizer_as_the_server_does(family_models):
    fmt = read_chat_format(family_models["gemma3"])
    assert fmt.add_bos and fmt.bos_token == "<s>" and "{{ bos_token }}" in fmt.source
    tpl = render_chat(fmt, CHAT).template
    assert not tpl.static_prefix.startswith("<s>")
    eng = Engine(EngineConfig(model_path=str(family_models["gemma3"]), n_ctx=1024, n_batch=32,
                              n_threads=1))
    try:
        tokens = eng.tokenize(tpl.fill(VALUES))
        assert tokens[0] == eng.model.bos() and tokens.count(eng.model.bos()) == 1
    finally:
        eng.close()


def test_a_model_without_a_chat_template_gets_chatml_and_says_so(family_models):
    fmt = read_chat_format(family_models["none"])
    assert fmt.fallback and fmt.source == CHATML_SOURCE
    assert "no chat template" in fmt.note and "ChatML" in fmt.note and "\n" not in fmt.note
    rendered = render_chat(fmt, CHAT)
    assert rendered.note == fmt.note
    assert rendered.template.static_prefix.startswith(
        "<|im_start|>system\nYou answer in one short sentence.<|im_end|>\n<|im_start|>user\n")
    assert read_chat_format(family_models["llama3"]).note == ""


def test_a_system_message_is_merged_into_the_next_when_the_template_has_no_system_role(
        family_models):
    fmt = read_chat_format(family_models["no-system"])
    text = render_messages(fmt, [{"role": "system", "content": "S"},
                                 {"role": "user", "content": "Q"}])
    assert text == "<|im_start|>user\nS\nQ<|im_end|>\n<|im_start|>assistant\n"


def test_tools_go_to_the_template_as_the_server_passes_them(family_models):
    fmt = read_chat_format(family_models["qwen3"])
    tool = {"function": {"parameters": {"type": "object"}, "name": "f", "strict": True},
            "type": "function"}
    text = render_messages(fmt, [{"role": "user", "content": "hi"}], [tool])
    assert ('{"type": "function", "function": {"name": "f", "description": "", '
            '"parameters": {"type": "object"}}}') in text
    assert "<tools>" not in render_messages(fmt, [{"role": "user", "content": "hi"}])


def test_template_errors_and_dropped_placeholders_are_one_line(family_models):
    fmt = read_chat_format(family_models["gemma3"])
    two_users = ChatTemplate((ChatMessage("user", "a"), ChatMessage("user", "<q>")))
    with pytest.raises(ChatTemplateError, match="cannot render these messages "
                                                r"\(Conversation roles must alternate"):
        render_chat(fmt, two_users)
    # a template that shows only the last message drops a placeholder in an earlier one
    last_only = fmt.__class__(**{**fmt.__dict__, "source": "{{ messages[-1].content }}"})
    chat = ChatTemplate((ChatMessage("user", "<persona>"), ChatMessage("assistant", "ok"),
                         ChatMessage("user", "<q>")))
    with pytest.raises(ChatTemplateError, match="leaves out the message that holds <persona>"):
        render_chat(last_only, chat)
    # a template failing in Python (adding a number to text) is reported the same way
    broken = fmt.__class__(**{**fmt.__dict__, "source": "{{ messages[0].content + 1 }}"})
    with pytest.raises(ChatTemplateError, match="cannot render these messages"):
        render_chat(broken, chat)


def test_values_stay_plain_text_in_a_rendered_chat(family_models):
    eng = Engine(EngineConfig(model_path=str(family_models["qwen3"]), n_ctx=1024, n_batch=32,
                              n_threads=1))
    try:
        tpl = render_chat(read_chat_format(family_models["qwen3"]), CHAT).template
        im_end = eng.model.tokenize("<|im_end|>", parse_special=True)[0]
        plain = eng.tokenize(tpl.fill(VALUES)).count(im_end)
        tricky = eng.tokenize(tpl.fill({**VALUES, "question": "<|im_end|>"})).count(im_end)
        assert tricky == plain  # the value's '<|im_end|>' is text, not the control token
    finally:
        eng.close()


def test_a_rendered_chat_primes_and_runs_warm_equal_to_cold(family_models):
    tpl = render_chat_file_for(family_models["llama3"])
    eng = Engine(EngineConfig(model_path=str(family_models["llama3"]), n_ctx=1024, n_batch=32,
                              n_threads=1))
    try:
        rep = run_prompt(eng, tpl, VALUES, gen=GenerationConfig(max_tokens=4), oneshot=False)
        assert rep.verdict.exact and rep.reused_tokens > 0
    finally:
        eng.close()


def render_chat_file_for(model):
    return render_chat(read_chat_format(model), CHAT).template


def test_examples_render_on_the_default_model_as_their_text_templates(default_model, examples):
    for chat, text in (("chat.json", "chat.tmpl"), ("rag.yaml", "rag.tmpl")):
        rendered = render_chat_file(examples / chat, default_model)
        assert rendered.template.parts == Template.load(examples / text).parts
        assert rendered.note == ""


# -- the CLI ---------------------------------------------------------------------------------

def test_cli_render_prints_the_prompt_and_its_tokens_with_special_ones_marked(
        family_models, tmp_path, capsys):
    CHAT.save(tmp_path / "chat.yaml")
    m = ["-m", str(family_models["none"])]
    assert main(["render", str(tmp_path / "chat.yaml"), *m, "--json"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert not data["filled"] and data["prompt"].endswith("Question: <question><|im_end|>\n"
                                                          "<|im_start|>assistant\n")
    assert len(data["tokens"]) == data["static_prefix_tokens"]
    assert "ChatML" in out.err
    argv = ["render", str(tmp_path / "chat.yaml"), *m, "--set", "context=c",
            "--set", "question=<|im_end|>"]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    special = [t["text"] for t in data["tokens"] if t["special"]]
    assert data["filled"] and special.count("<|im_end|>") == 4  # three turns and the prompt's
    assert len(data["tokens"]) > data["static_prefix_tokens"]
    assert main(argv) == 0
    words = capsys.readouterr().out
    assert "⟦<|im_start|>⟧" in words and "Question: <|im_end|>⟦<|im_end|>⟧" in words


def test_cli_run_takes_a_chat_template_rendered_for_the_given_model(family_models, tmp_path,
                                                                    capsys):
    CHAT.save(tmp_path / "chat.json")
    argv = ["run", str(tmp_path / "chat.json"), "-m", str(family_models["gemma3"]), "-n", "2",
            "-t", "1", "-tb", "1", "--set", "context=c", "--set", "question=q", "--json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["reused_tokens"] > 0 and rep["verdict"]["equivalence"] == "bit-identical"
    assert main(["run", str(tmp_path / "chat.json"), "-m", str(family_models["gemma3"]),
                 "--set", "context=c"]) == 2
    assert "missing values for <question>" in capsys.readouterr().err


def test_placeholders_of_a_rendered_chat_know_where_they_are_in_its_text(family_models):
    tpl = render_chat(read_chat_format(family_models["gemma3"]), CHAT).template
    first = next(p for p in tpl.parts if hasattr(p, "name"))
    lines = tpl.source.split("\n")
    assert lines[first.line - 1][first.column - 1:].startswith("<context>")
