"""kimipipe.io: inputs by content, record errors with PATH:LINE, durable writes, torn-tail repair."""

from __future__ import annotations

import os

import msgspec
import pytest
import zstandard

from kimipipe.errors import InputError
from kimipipe.io import RecordWriter, iter_records, open_input, repair_torn_tail, scan_done
from kimipipe.records import Prompt, encode_line

prompt_decoder = msgspec.json.Decoder(Prompt)
GOOD = b'{"id": "a", "dataset": "B3", "messages": [{"role": "user", "content": "hi"}]}\n'


def test_zstd_input_is_recognised_by_content_not_name(tmp_path):
    path = tmp_path / "prompts.jsonl"  # no .zst suffix
    path.write_bytes(zstandard.ZstdCompressor().compress(GOOD * 3))
    with open_input(str(path)) as f:
        assert f.read() == GOOD * 3
    assert [r.id for _, r, _ in iter_records(str(path), prompt_decoder)] == ["a", "a", "a"]


@pytest.mark.parametrize("bad, message", [
    (b'{"id": "b", "dataset": "B3", "messages": [{"role": "robot", "content": "x"}]}\n',
     "at `$.messages[0].role`"),
    (b'{"id": "b", "dataset": "B3"}\n', "missing required field `messages`"),
    (b'{"id": 7, "dataset": "B3", "messages": []}\n', "Expected `str`, got `int` at `$.id`"),
    (b'{"id": "\xff", "dataset": "B3", "messages": []}\n', "invalid UTF-8"),
    (b'{"id": "b", "dataset": "B3", "mess', "truncated final line"),
])
def test_bad_record_names_path_line_and_field(tmp_path, bad, message):
    path = tmp_path / "in.jsonl"
    path.write_bytes(GOOD + bad)
    with pytest.raises(InputError) as err:
        list(iter_records(str(path), prompt_decoder))
    assert err.value.message.startswith(f"{path}:2: ")
    assert message in err.value.message


def test_empty_input_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"\n\n")
    with pytest.raises(InputError, match="empty input"):
        list(iter_records(str(path), prompt_decoder))


def test_final_line_without_newline_is_accepted_when_complete(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(GOOD + GOOD.rstrip(b"\n"))
    assert len(list(iter_records(str(path), prompt_decoder))) == 2


def test_torn_tail_of_plain_file_is_cut_and_its_id_redone(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(GOOD + GOOD.replace(b'"a"', b'"b"') + b'{"id": "c", "datas')
    assert repair_torn_tail(str(path)) == 3
    assert path.read_bytes().endswith(b"\n")
    assert scan_done(str(path)) == {"a", "b"}
    assert repair_torn_tail(str(path)) is None


def test_torn_tail_of_zstd_file_is_repaired(tmp_path):
    path = tmp_path / "out.jsonl.zst"
    with RecordWriter(str(path), durable=True) as w:
        w.write_line(GOOD)
        w.write_line(GOOD.replace(b'"a"', b'"b"'))
    # A crash mid-block: a second frame whose end never reached the disk.
    tail = zstandard.ZstdCompressor().compress(GOOD.replace(b'"a"', b'"c"') * 50)
    with open(path, "ab") as f:
        f.write(tail[: len(tail) // 2])
    assert scan_done(str(path)) == {"a", "b"}
    with RecordWriter(str(path), append=True, durable=True) as w:
        w.write_line(GOOD.replace(b'"a"', b'"d"'))
    assert scan_done(str(path)) == {"a", "b", "d"}


def test_corrupt_line_in_the_middle_of_an_output_is_an_error_not_dropped(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(GOOD + b"garbage\n" + GOOD)
    with pytest.raises(InputError, match=":2: "):
        scan_done(str(path))
    assert path.read_bytes() == GOOD + b"garbage\n" + GOOD


def test_durable_writer_appends_whole_lines(tmp_path):
    path = tmp_path / "out.jsonl"
    with RecordWriter(str(path), durable=True) as w:
        w.write_line(encode_line(Prompt(id="x", dataset="", messages=[])))
        assert os.path.getsize(path) > 0  # on disk before close
    with RecordWriter(str(path), append=True, durable=True) as w:
        w.write_line(GOOD)
    assert scan_done(str(path)) == {"x", "a"}
