from textutil import whisper


def test_whisper():
    assert whisper("HeLLo") == "hello"
