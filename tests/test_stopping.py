from specwise.stopping import StopTracker
from specwise.testing import tiny_tokenizer

TOK = tiny_tokenizer()


def ids(text):
    return TOK(text)["input_ids"]


def feed(tracker, text, chunk=3):
    tokens = ids(text)
    events = []
    for i in range(0, len(tokens), chunk):
        events += tracker.push(tokens[i:i + chunk], num_from_draft=1)
        if tracker.done:
            break
    return events


def test_stop_string_inside_a_block_cuts_text_and_tokens():
    tracker = StopTracker(TOK, 100, [], ["END"])
    events = feed(tracker, "hello END world")
    assert tracker.finish_reason == "stop"
    assert tracker.text == "hello "
    assert "".join(e.text for e in events) == "hello "
    assert TOK.decode(tracker.token_ids) == "hello END"  # tokens up to the one completing the stop


def test_text_that_may_start_a_stop_string_is_held_back():
    tracker = StopTracker(TOK, 100, [], ["END"])
    released = "".join(e.text for e in tracker.push(ids("abc E"), 0))
    assert released == "abc "  # "E" might begin "END"
    released += "".join(e.text for e in tracker.push(ids("x"), 0))
    assert released == "abc Ex" and not tracker.done


def test_stop_id_and_max_tokens():
    tracker = StopTracker(TOK, 100, [ids("!")[0]], [])
    events = feed(tracker, "hi! more")
    assert tracker.finish_reason == "stop" and [e.token_id for e in events] == ids("hi!")
    tracker = StopTracker(TOK, 4, [], [])
    events = feed(tracker, "abcdefgh")
    assert tracker.finish_reason == "length" and "".join(e.text for e in events) == "abcd"


def test_draft_flags_follow_the_step():
    tracker = StopTracker(None, 10, [], [])
    events = tracker.push([5, 6, 7], num_from_draft=2)
    assert [e.from_draft for e in events] == [True, True, False]
