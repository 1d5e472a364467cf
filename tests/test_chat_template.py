"""DS4 chat rendering (spec ds4.md §4.3): the spec's worked examples and multi-turn rules.

Expected sequences are written out as marker constants plus the text ids that tokenizer.json
gives for each text part.
"""

from __future__ import annotations

import pytest

from ds4tui.engine.tokenizer import Tokenizer, TokenizerError, render_chat, render_chat_text

BOS, EOS = 0, 1
USER, ASSISTANT = 128803, 128804
THINK, END_THINK = 128821, 128822

# Text ids (tokenizer.json, no markers):
HI = [23166]  # "Hi"
HELLO = [19923]  # "Hello"
HOW_CAN_I_HELP = [19923, 3, 1730, 588, 342, 1694, 33]  # "Hello! How can I help?"
JOKE = [50433, 678, 260, 38112, 16]  # "Tell me a joke."
GREETS = [671, 3967, 2814, 1697, 678, 16]  # "The user greets me."
WHY = [11687, 33]  # "Why?"
BECAUSE = [18850, 16]  # "Because."
THINK_FIRST = [50012, 1257, 16]  # "Think first."
DEFAULT_SYSTEM = [3476, 477, 260, 11502, 22896]  # "You are a helpful assistant"
# "You are a helpful assistant\n\nBe brief.\n\nAnswer in English."
JOINED_SYSTEM = [3476, 477, 260, 11502, 22896, 271, 7153, 9708, 339, 7805, 295, 3947, 16]
# "Say <｜User｜> and </think>." as plain text: 'Say', ' <', '｜', 'User', '｜', '>', ' and', ' </', 'think', '>.'
SAY_MARKERS_PLAIN = [63006, 818, 28217, 6756, 28217, 32, 305, 2728, 37947, 43386]

ITALIAN = "Rispondi in italiano con una frase: chi era Ada Lovelace?"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_tokenizer_json()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str, reasoning: str | None = None) -> dict:
    msg = {"role": "assistant", "content": text}
    if reasoning is not None:
        msg["reasoning"] = reasoning
    return msg


# -- spec worked examples ------------------------------------------------------------------------


def test_spec_italian_nothink_no_system(tok: Tokenizer) -> None:
    ids = render_chat(tok, [user(ITALIAN)], think=False, system="")
    assert ids == [0, 128803, 52, 278, 4908, 75, 295, 89034, 399, 3919, 123003, 28, 23442, 9861, 63030, 47121,
                   317, 805, 33, 128804, 128822]
    assert len(ids) == 21  # usage.prompt_tokens of the official vector
    assert render_chat(tok, [user(ITALIAN)], think=False, system=None) == ids


def test_spec_default_system_hello_think(tok: Tokenizer) -> None:
    ids = render_chat(tok, [user("Hello")], think=True, system="You are a helpful assistant")
    assert ids == [0, 3476, 477, 260, 11502, 22896, 128803, 19923, 128804, 128821]
    assert ids == [BOS, *DEFAULT_SYSTEM, USER, *HELLO, ASSISTANT, THINK]


# -- multi-turn ----------------------------------------------------------------------------------

CHAT = [user("Hi"), assistant("Hello! How can I help?", reasoning="The user greets me."), user("Tell me a joke.")]


def test_multi_turn_think_drops_reasoning_before_last_user(tok: Tokenizer) -> None:
    assert render_chat(tok, CHAT, think=True) == [
        BOS,
        USER, *HI,
        ASSISTANT, END_THINK, *HOW_CAN_I_HELP, EOS,
        USER, *JOKE,
        ASSISTANT, THINK,
    ]


def test_multi_turn_nothink(tok: Tokenizer) -> None:
    assert render_chat(tok, CHAT, think=False) == [
        BOS,
        USER, *HI,
        ASSISTANT, END_THINK, *HOW_CAN_I_HELP, EOS,
        USER, *JOKE,
        ASSISTANT, END_THINK,
    ]


def test_assistant_after_last_user_keeps_reasoning_in_think_mode(tok: Tokenizer) -> None:
    chat = [user("Why?"), assistant("Because.", reasoning="Think first.")]
    assert render_chat(tok, chat, think=True, add_generation_prompt=False) == [
        BOS, USER, *WHY, ASSISTANT, THINK, *THINK_FIRST, END_THINK, *BECAUSE, EOS,
    ]
    assert render_chat(tok, chat, think=False, add_generation_prompt=False) == [
        BOS, USER, *WHY, ASSISTANT, END_THINK, *BECAUSE, EOS,
    ]
    # No reasoning recorded: an empty think block.
    assert render_chat(tok, [user("Why?"), assistant("Because.")], think=True, add_generation_prompt=False) == [
        BOS, USER, *WHY, ASSISTANT, THINK, END_THINK, *BECAUSE, EOS,
    ]


def test_two_completed_turns_then_question(tok: Tokenizer) -> None:
    chat = [user("Hi"), assistant("Hello", reasoning="x"), user("Why?"), assistant("Because.", reasoning="y"),
            user("Tell me a joke.")]
    assert render_chat(tok, chat, think=True) == [
        BOS,
        USER, *HI, ASSISTANT, END_THINK, *HELLO, EOS,
        USER, *WHY, ASSISTANT, END_THINK, *BECAUSE, EOS,
        USER, *JOKE, ASSISTANT, THINK,
    ]


def test_system_and_developer_texts_join_after_bos(tok: Tokenizer) -> None:
    chat = [
        {"role": "system", "content": "Be brief."},
        user("Hi"),
        {"role": "developer", "content": "Answer in English."},
    ]
    assert render_chat(tok, chat, system="You are a helpful assistant") == [
        BOS, *JOINED_SYSTEM, USER, *HI, ASSISTANT, THINK,
    ]
    # Empty system texts add nothing.
    chat = [{"role": "system", "content": ""}, user("Hi")]
    assert render_chat(tok, chat, system="") == [BOS, USER, *HI, ASSISTANT, THINK]


def test_each_user_message_gets_its_own_marker(tok: Tokenizer) -> None:
    assert render_chat(tok, [user("Hi"), user("Why?")]) == [BOS, USER, *HI, USER, *WHY, ASSISTANT, THINK]
    assert render_chat(tok, [user("")]) == [BOS, USER, ASSISTANT, THINK]


def test_marker_strings_in_user_text_stay_plain(tok: Tokenizer) -> None:
    text = "Say <｜User｜> and </think>."
    assert render_chat(tok, [user(text)], think=False) == [BOS, USER, *SAY_MARKERS_PLAIN, ASSISTANT, END_THINK]
    assert tok.decode(SAY_MARKERS_PLAIN) == text


# -- text form -----------------------------------------------------------------------------------


def test_render_chat_text(tok: Tokenizer) -> None:
    text = render_chat_text(CHAT, think=True, system="You are a helpful assistant")
    assert text == (
        "<｜begin▁of▁sentence｜>You are a helpful assistant"
        "<｜User｜>Hi<｜Assistant｜></think>Hello! How can I help?<｜end▁of▁sentence｜>"
        "<｜User｜>Tell me a joke.<｜Assistant｜><think>"
    )
    assert tok.encode(text) == render_chat(tok, CHAT, think=True, system="You are a helpful assistant")
    chat = [user("Why?"), assistant("Because.", reasoning="Think first.")]
    text = render_chat_text(chat, think=True, add_generation_prompt=False)
    assert text == (
        "<｜begin▁of▁sentence｜><｜User｜>Why?<｜Assistant｜><think>Think first.</think>Because.<｜end▁of▁sentence｜>"
    )
    assert tok.encode(text) == render_chat(tok, chat, think=True, add_generation_prompt=False)


# -- errors --------------------------------------------------------------------------------------


def test_errors(tok: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match="role 'tool'"):
        render_chat(tok, [{"role": "tool", "content": "42"}, user("Hi")])
    with pytest.raises(TokenizerError, match="user message last"):
        render_chat(tok, [user("Hi"), assistant("Hello")])
    with pytest.raises(TokenizerError, match="user message last"):
        render_chat(tok, [])
    with pytest.raises(TokenizerError, match="no string 'content'"):
        render_chat(tok, [{"role": "user"}])
    assert render_chat(tok, [], add_generation_prompt=False, system="You are a helpful assistant") == [
        BOS, *DEFAULT_SYSTEM,
    ]
