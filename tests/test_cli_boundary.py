"""The command line's error boundary: a user error is one `error:` line and exit 2, any other exception
one line saying it is a bug (exit 1) with the traceback only on request, and no message runs to
megabytes (a damaged file's bytes can end up in one)."""

import pytest

import specwise.cli as cli


def fail_with(error):
    def command(args):
        raise error
    return command


def test_a_user_error_is_one_bounded_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "cmd_generate", fail_with(ValueError("bad name " + "\x00x" * 5_000_000)))
    assert cli.main(["generate", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bad name") and err.count("\n") == 1
    assert len(err) < cli.MAX_ERROR_CHARS + 100 and "(10000009 characters)" in err


def test_an_unexpected_error_is_reported_as_a_bug_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "cmd_generate", fail_with(ZeroDivisionError("division by zero")))
    assert cli.main(["generate", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "unexpected ZeroDivisionError: division by zero" in err and "bug in specwise" in err and "--debug" in err


def test_the_traceback_on_request(monkeypatch):
    monkeypatch.setattr(cli, "cmd_generate", fail_with(ZeroDivisionError("division by zero")))
    with pytest.raises(ZeroDivisionError):
        cli.main(["--debug", "generate", "hi"])
    monkeypatch.setenv("SPECWISE_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["generate", "hi"])


def test_serve_reports_a_taken_port_before_loading_anything(capsys):
    """The port is bound first: with a target that does not exist, the error names the port, not the model."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert cli.main(["serve", "--target", "/nonexistent/model.gguf", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "choose another --port" in err
    assert "nonexistent" not in err and err.count("\n") == 1


def test_export_misuse_is_a_user_error(tmp_path, capsys):
    assert cli.main(["export", "vllm", "--drafter", "bogus"]) == 2
    assert "unknown drafter 'bogus'" in capsys.readouterr().err
    assert cli.main(["export", "vllm", "--out", str(tmp_path / "missing" / "x.json")]) == 2
    assert "cannot write --out" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text('{"method": "a"}\n')
    for meta, fragment in (("[1, 2]", "not a run description"), ("{not json", "not JSON"),
                           ('{"methods": [{"label": "a"}]}', "line 1: not a bench record (no task")):
        (run / "run.json").write_text(meta)
        assert cli.main(["export", "vllm", "--from-bench", str(run)]) == 2
        err = capsys.readouterr().err
        assert fragment in err and str(run) in err and err.count("\n") == 1, err


def test_a_chat_template_that_does_not_compile_is_a_user_error():
    from specwise import SpecConfig, SpecDecoder
    from specwise.testing import tiny_loaded

    loaded = tiny_loaded(0)
    loaded.tokenizer.chat_template = "{% if %}broken"
    decoder = SpecDecoder(loaded, SpecConfig(drafter="none"))
    with pytest.raises(ValueError, match="chat template rejected these messages.*--raw"):
        decoder.encode("hello", chat=True)


def test_serve_on_ray_reports_a_taken_port_before_ray_starts(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert cli.main(["serve", "--replicas", "2", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_directory_named_like_a_gguf_file_is_named_as_a_directory(tmp_path):
    from specwise.errors import ModelError
    from specwise.store.prepare import gguf_file

    (tmp_path / "x.gguf").mkdir()
    with pytest.raises(ModelError, match="is a directory, not a GGUF file"):
        gguf_file(tmp_path / "x.gguf")
