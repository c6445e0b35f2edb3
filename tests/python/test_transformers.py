"""cairn.transformers against a real daemon, with tiny models built from configs (no downloads).

- A BERT classifier saved and loaded with the Auto class and with its own class gives the same
  logits, bit for bit; on the host its weights are copy-on-write views (a training step changes
  the loaded model, never the stored one); bf16 stays bf16 and torch_dtype casts.
- A GPT-2 with tied embeddings is stored with one copy of the tied tensor and loads re-tied, with
  its generation config.
- A fine-tune that changes only the classifier head, saved with the base as parent, stores only
  the head's bytes; a base model loads into a class with a new head (strict=False initialises it).
- A tokenizer built offline from a vocabulary file round-trips and is inherited, not stored again.
- CairnCallback in a real Trainer run on CPU stores each checkpoint derived from the previous one.
- Wrong inputs (not a transformers model, a class of another model type, missing tensors, a
  device map that places nothing) and an unreachable daemon raise CairnErrors that say what to do.
- CUDA device reads (skipped without a GPU).
"""
import copy
import logging
import os

import pytest

if os.environ.get("CAIRN_SANITIZED") == "1" and "libasan" not in os.environ.get("LD_PRELOAD", ""):
    pytest.skip("sanitized build: start this Python with LD_PRELOAD as in ctypes_env()", allow_module_level=True)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
    GPT2Config,
    GPT2LMHeadModel,
)

import cairn  # noqa: E402
import cairn.torch as ct  # noqa: E402
import cairn.transformers as ctf  # noqa: E402

transformers.logging.set_verbosity_error()


def bert_config(**kw):
    return BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, **kw)


def tiny_bert(seed=0, **kw):
    torch.manual_seed(seed)
    return BertForSequenceClassification(bert_config(**kw)).eval()


def tiny_gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=1,
                     eos_token_id=2, tie_word_embeddings=True)
    return GPT2LMHeadModel(cfg).eval()


def inputs(seed=1, batch=3, length=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@torch.no_grad()
def logits(model, x):
    return model(**x).logits


def physical(client):
    return client.stats()["repository"]["physical_bytes"]


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.fixture
def sent(client, monkeypatch):
    """What each commit through ``client`` sent: model id -> (tensors sent, tensors inherited)."""
    seen = {}
    save_model = client.save_model

    def spy(id, tensors, *args, **kwargs):
        seen[id] = (list(tensors), list(kwargs.get("inherit", ())))
        return save_model(id, tensors, *args, **kwargs)

    monkeypatch.setattr(client, "save_model", spy)
    return seen


def assert_same_weights(got, want):
    g, w = got.state_dict(), want.state_dict()
    assert list(g) == list(w)
    for k in w:
        assert g[k].dtype == w[k].dtype and torch.equal(g[k], w[k]), k


# ---- save and load ----

def test_bert_loads_with_the_auto_class_and_its_own_class_with_identical_logits(client):
    model = tiny_bert()
    x = inputs()
    want = logits(model, x)
    t = ctf.save_pretrained(model, "hf/bert", client=client, meta={"task": "sst2"})
    assert t.done and t.reached == "global"

    info = client.show("hf/bert")
    names = [t["name"] for t in info["tensors"]]
    assert names == list(model.state_dict())  # the state dict's names and order, nothing else
    record = info["metadata"][ctf.RECORD_KEY]
    assert info["metadata"]["task"] == "sst2"
    assert record["class"] == "BertForSequenceClassification" and record["dtype"] == "float32"
    assert record["config"]["model_type"] == "bert" and record["config"]["hidden_size"] == 32
    assert "tokenizer" not in record and "tied" not in record
    assert info["architecture"]["layers"]

    for cls in (AutoModelForSequenceClassification, BertForSequenceClassification):
        got = ctf.from_pretrained(cls, "hf/bert", client=client)
        assert type(got) is BertForSequenceClassification and not got.training
        assert all(p.device.type == "cpu" for p in got.parameters())
        assert got.config.hidden_size == 32 and got.config.name_or_path == "hf/bert"
        assert_same_weights(got, model)
        assert torch.equal(logits(got, x), want)


def test_loaded_weights_train_without_changing_the_stored_model(client):
    model = tiny_bert(seed=3)
    ctf.save_pretrained(model, "hf/cow", client=client)
    got = ctf.from_pretrained(BertForSequenceClassification, "hf/cow", client=client)
    assert all(p.requires_grad for p in got.parameters())
    got.train()
    opt = torch.optim.SGD(got.parameters(), lr=0.5)
    x = inputs(seed=4)
    loss = got(**x, labels=torch.tensor([0, 1, 0])).loss
    loss.backward()
    opt.step()
    assert not torch.equal(got.classifier.weight, model.classifier.weight)  # the copy-on-write views took the step
    again = ctf.from_pretrained(BertForSequenceClassification, "hf/cow", client=client)
    assert_same_weights(again, model)  # the stored model did not


def test_bf16_stays_bf16_and_torch_dtype_casts(client):
    model = tiny_bert(seed=5).to(torch.bfloat16)
    x = inputs(seed=6)
    ctf.save_pretrained(model, "hf/bf16", client=client)
    info = client.show("hf/bf16")
    assert {t["dtype"] for t in info["tensors"] if t["name"].endswith(".weight")} == {"BF16"}
    assert info["metadata"][ctf.RECORD_KEY]["dtype"] == "bfloat16"
    got = ctf.from_pretrained(AutoModelForSequenceClassification, "hf/bf16", client=client)
    assert got.dtype == torch.bfloat16
    assert_same_weights(got, model)
    assert torch.equal(logits(got, x), logits(model, x))
    f32 = ctf.from_pretrained(AutoModelForSequenceClassification, "hf/bf16", client=client, torch_dtype=torch.float32)
    assert f32.dtype == torch.float32
    assert torch.equal(f32.classifier.weight, model.classifier.weight.float())


def test_gpt2_tied_embeddings_stored_once_and_retied(client):
    model = tiny_gpt2()
    model.generation_config.max_new_tokens = 7
    assert model.lm_head.weight is model.transformer.wte.weight
    ctf.save_pretrained(model, "hf/gpt2", client=client)
    info = client.show("hf/gpt2")
    names = [t["name"] for t in info["tensors"]]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    record = info["metadata"][ctf.RECORD_KEY]
    assert record["tied"] == {"lm_head.weight": "transformer.wte.weight"}
    assert record["generation_config"]["max_new_tokens"] == 7

    x = inputs(seed=2)
    for cls in (AutoModelForCausalLM, GPT2LMHeadModel):
        got = ctf.from_pretrained(cls, "hf/gpt2", client=client)
        assert got.lm_head.weight is got.transformer.wte.weight
        assert got.generation_config.max_new_tokens == 7
        assert_same_weights(got, model)
        assert torch.equal(logits(got, x), logits(model, x))
        out = got.generate(x["input_ids"][:1, :4], do_sample=False, max_new_tokens=3, pad_token_id=0)
        assert torch.equal(out, model.generate(x["input_ids"][:1, :4], do_sample=False, max_new_tokens=3,
                                               pad_token_id=0))


def test_device_maps_on_the_host(client):
    model = tiny_bert(seed=7)
    ctf.save_pretrained(model, "hf/dm", client=client)
    x = inputs()
    for dm in ("cpu", torch.device("cpu"), {"bert": "cpu", "classifier": "cpu"}, {"": "cpu"}, "auto"):
        got = ctf.from_pretrained(BertForSequenceClassification, "hf/dm", device_map=dm, client=client)
        assert torch.equal(logits(got, x), logits(model, x)), dm
        assert got.hf_device_map
    with pytest.raises(cairn.InvalidArgument, match="does not place 'classifier.weight'"):
        ctf.from_pretrained(BertForSequenceClassification, "hf/dm", device_map={"bert": "cpu"}, client=client)
    with pytest.raises(cairn.InvalidArgument, match="on disk"):
        ctf.from_pretrained(BertForSequenceClassification, "hf/dm", device_map={"": "disk"}, client=client)


# ---- parents ----

def test_finetuned_head_with_the_base_as_parent_stores_only_the_head(client, sent):
    base = tiny_bert(seed=11)
    ctf.save_pretrained(base, "hf/ft/base", client=client)
    ft = copy.deepcopy(base)
    with torch.no_grad():
        ft.classifier.weight.add_(0.25)
        ft.classifier.bias.fill_(0.5)
    before = physical(client)
    ctf.save_pretrained(ft, "hf/ft/child", parent="hf/ft/base", client=client)
    stored = physical(client) - before
    head = nbytes([ft.classifier.weight, ft.classifier.bias])
    assert 0 < stored <= head, (stored, head)

    child = client.show("hf/ft/child")
    assert child["parent"] == "hf/ft/base"
    assert [t["name"] for t in child["tensors"]] == list(ft.state_dict())
    new, inherited = sent["hf/ft/child"]
    assert new == ["classifier.weight", "classifier.bias"]
    assert sorted(inherited) == sorted(set(ft.state_dict()) - set(new))

    got = ctf.from_pretrained(AutoModelForSequenceClassification, "hf/ft/child", client=client)
    x = inputs(seed=12)
    assert torch.equal(logits(got, x), logits(ft, x))
    assert not torch.equal(logits(got, x), logits(base, x))


def test_a_bare_model_and_a_model_with_a_head_load_into_each_other_only_when_not_strict(client):
    torch.manual_seed(13)
    bare = BertModel(bert_config()).eval()
    ctf.save_pretrained(bare, "hf/bare", client=client)
    with pytest.raises(cairn.InvalidArgument, match=r"no tensor for classifier\.weight.*strict=False"):
        ctf.from_pretrained(BertForSequenceClassification, "hf/bare", client=client)
    got = ctf.from_pretrained(BertForSequenceClassification, "hf/bare", client=client, strict=False, num_labels=3)
    assert got.classifier.weight.shape == (3, 32) and got.classifier.weight.device.type == "cpu"
    assert torch.count_nonzero(got.classifier.weight) > 0 and torch.count_nonzero(got.classifier.bias) == 0
    assert_same_weights(got.bert, bare)  # loaded under "bert.", not initialised again

    headed = tiny_bert(seed=14)
    ctf.save_pretrained(headed, "hf/headed", client=client)
    with pytest.raises(cairn.InvalidArgument, match=r"lacks: classifier\.weight, classifier\.bias .*strict=False"):
        ctf.from_pretrained(BertModel, "hf/headed", client=client)
    got = ctf.from_pretrained(BertModel, "hf/headed", client=client, strict=False)
    assert_same_weights(got, headed.bert)
    x = inputs(seed=15)
    with torch.no_grad():
        assert torch.equal(got(**x).last_hidden_state, headed.bert(**x).last_hidden_state)


# ---- tokenizer ----

def write_vocab(path):
    words = ["hello", "world", "cairn", "caches", "models", "the", "a", "fast", "##s", "##ing"]
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
    return path


def test_tokenizer_files_round_trip_and_are_inherited(client, sent, tmp_path):
    tok = BertTokenizerFast(vocab_file=str(write_vocab(tmp_path / "vocab.txt")), do_lower_case=True)
    model = tiny_bert(seed=21)
    ctf.save_pretrained(model, "hf/tok/base", client=client, tokenizer=tok)
    record = client.show("hf/tok/base")["metadata"][ctf.RECORD_KEY]
    assert "tokenizer.json" in record["tokenizer"] and "tokenizer_config.json" in record["tokenizer"]
    names = [t["name"] for t in client.show("hf/tok/base")["tensors"]]
    assert [n for n in names if n.startswith(ctf.TOKENIZER_PREFIX)] == \
        [ctf.TOKENIZER_PREFIX + f for f in record["tokenizer"]]

    got = ctf.load_tokenizer("hf/tok/base", client=client)
    text = ["Hello world, the fast cairn caches models", "a models hello"]
    assert got(text)["input_ids"] == tok(text)["input_ids"]
    assert got.convert_ids_to_tokens(got("caches")["input_ids"]) == tok.convert_ids_to_tokens(tok("caches")["input_ids"])
    enc = got(text, return_tensors="pt", padding=True)
    loaded = ctf.from_pretrained(AutoModelForSequenceClassification, "hf/tok/base", client=client)
    assert torch.equal(logits(loaded, dict(enc)), logits(model, dict(enc)))  # weights load past the files

    ft = copy.deepcopy(model)
    with torch.no_grad():
        ft.classifier.bias.fill_(1.0)
    before = physical(client)
    ctf.save_pretrained(ft, "hf/tok/ft", parent="hf/tok/base", client=client, tokenizer=tok)
    assert physical(client) - before <= nbytes([ft.classifier.bias])
    assert sent["hf/tok/ft"][0] == ["classifier.bias"]  # the files were inherited
    assert ctf.load_tokenizer("hf/tok/ft", client=client)(text)["input_ids"] == tok(text)["input_ids"]

    with pytest.raises(cairn.NotFound, match="holds no tokenizer files.*tokenizer="):
        ctf.load_tokenizer("hf/bert", client=client)


# ---- Trainer ----

class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n=16):
        g = torch.Generator().manual_seed(31)
        self.ids = torch.randint(3, 100, (n, 10), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def test_trainer_callback_stores_each_checkpoint_derived_from_the_previous(client, sent, tmp_path):
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    base = tiny_bert(seed=32)
    ctf.save_pretrained(base, "hf/run/base", client=client)
    model = ctf.from_pretrained(BertForSequenceClassification, "hf/run/base", client=client)
    for p in model.bert.parameters():  # only the head trains
        p.requires_grad_(False)
    callback = ctf.CairnCallback("hf/run/sst2", client=client, meta={"run": "t1"})
    with pytest.raises(cairn.InvalidArgument, match="prefix must be a non-empty str"):
        ctf.CairnCallback("/")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, save_steps=2, save_strategy="steps",
                             per_device_train_batch_size=4, learning_rate=0.1, report_to=[], use_cpu=True,
                             logging_strategy="no", disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[callback])
    trainer.train()

    ids = [f"hf/run/sst2/checkpoint-{s}" for s in (2, 4, 6)]
    assert callback.saved == ids
    parents = [client.show(i)["parent"] for i in ids]
    assert parents == ["hf/run/base"] + ids[:-1]  # the model's origin, then the previous checkpoint
    last = client.show(ids[-1])["metadata"]
    assert last["step"] == 6 and last["run"] == "t1" and last["epoch"] > 0

    # The frozen layers are inherited: each checkpoint sent only the head.
    for i in ids:
        assert sent[i][0] == ["classifier.weight", "classifier.bias"], i

    got = ctf.from_pretrained(AutoModelForSequenceClassification, ids[-1], client=client)
    assert_same_weights(got, trainer.model)
    assert os.path.isdir(tmp_path / "out" / "checkpoint-6")  # the Trainer's own checkpoints as before

    # A run resumed at step 6 goes on from the checkpoint of that step.
    resumed = ctf.CairnCallback("hf/run/sst2", client=client)
    state = FakeState(global_step=6)
    resumed.on_train_begin(FakeArgs(), state, None)
    state.global_step = 8
    resumed.on_save(FakeArgs(), state, None, model=trainer.model)
    assert resumed.saved == ["hf/run/sst2/checkpoint-8"]
    assert client.show("hf/run/sst2/checkpoint-8")["parent"] == ids[-1]


class FakeState:
    """The fields of transformers' TrainerState that CairnCallback reads."""

    def __init__(self, global_step, epoch=1.0):
        self.global_step, self.epoch, self.best_metric, self.is_world_process_zero = global_step, epoch, None, True


class FakeArgs:
    output_dir = "out"


# ---- errors ----

def test_wrong_inputs_say_what_to_do(client):
    with pytest.raises(cairn.InvalidArgument, match="takes a transformers model"):
        ctf.save_pretrained(torch.nn.Linear(2, 2), "hf/linear", client=client)
    model = tiny_bert(seed=41)
    with pytest.raises(cairn.InvalidArgument, match="must not hold the key"):
        ctf.save_pretrained(model, "hf/x", client=client, meta={ctf.RECORD_KEY: 1})
    with pytest.raises(cairn.NotFound):
        ctf.save_pretrained(model, "hf/x", parent="hf/no-such-parent", client=client)
    with pytest.raises(cairn.NotFound):
        ctf.from_pretrained(BertForSequenceClassification, "hf/no-such-model", client=client)

    ctf.save_pretrained(model, "hf/taken", client=client)
    with pytest.raises(cairn.AlreadyExists):
        ctf.save_pretrained(model, "hf/taken", client=client)
    with pytest.raises(cairn.InvalidArgument, match="is a 'bert' model .* GPT2LMHeadModel takes 'gpt2'"):
        ctf.from_pretrained(GPT2LMHeadModel, "hf/taken", client=client)
    with pytest.raises(TypeError, match="no_such_option"):
        ctf.from_pretrained(BertForSequenceClassification, "hf/taken", client=client, no_such_option=1)
    with pytest.raises(cairn.InvalidArgument, match="shapes differ for classifier.weight"):
        ctf.from_pretrained(BertForSequenceClassification, "hf/taken", client=client, num_labels=5)

    # A model stored another way loads with the config given.
    ct.save(model.state_dict(), "hf/plain", client=client)
    with pytest.raises(cairn.InvalidArgument, match="holds no transformers config.*config="):
        ctf.from_pretrained(BertForSequenceClassification, "hf/plain", client=client)
    got = ctf.from_pretrained(BertForSequenceClassification, "hf/plain", client=client, config=model.config)
    assert_same_weights(got, model)


def test_an_unreachable_daemon_is_a_clear_error(monkeypatch, tmp_path, caplog):
    socket = str(tmp_path / "nobody" / "cairnd.sock")
    monkeypatch.setenv("CAIRN_SOCKET", socket)
    monkeypatch.setattr(ct, "_default", None)  # the process's shared client: connected again, to $CAIRN_SOCKET
    model = tiny_bert(seed=51)
    with pytest.raises(cairn.Unavailable, match=socket):
        ctf.save_pretrained(model, "hf/unreachable")
    with pytest.raises(cairn.Unavailable, match=socket):
        ctf.from_pretrained(BertForSequenceClassification, "hf/unreachable")

    with pytest.raises(cairn.Unavailable, match=socket):
        ctf.CairnCallback("hf/unreachable").on_save(FakeArgs(), FakeState(3), None, model=model)
    other = str(tmp_path / "other" / "cairnd.sock")
    with pytest.raises(cairn.Unavailable, match=other):
        ctf.CairnCallback("hf/unreachable", socket=other).on_save(FakeArgs(), FakeState(3), None, model=model)
    fallback = ctf.CairnCallback("hf/unreachable", fallback=True)
    with caplog.at_level(logging.WARNING, logger="cairn.transformers"):
        fallback.on_save(FakeArgs(), FakeState(3), None, model=model)
    assert "checkpoint 'hf/unreachable/checkpoint-3' was not stored" in caplog.text and socket in caplog.text
    assert fallback.saved == [] and fallback.last_model is None


# ---- CUDA ----

def test_cuda_device_map_reads_straight_into_device_memory(client):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the direct device reads of from_pretrained(device_map='cuda') are not run")
    model = tiny_gpt2(seed=61)
    ctf.save_pretrained(model, "hf/cuda", client=client)
    got = ctf.from_pretrained(AutoModelForCausalLM, "hf/cuda", device_map="cuda", client=client)
    assert all(p.device.type == "cuda" for p in got.parameters())
    assert all(b.device.type == "cuda" for b in got.buffers())
    assert got.lm_head.weight is got.transformer.wte.weight
    assert_same_weights(got.cpu(), model)
