"""The BiLSTM student: the same states as a packed bidirectional LSTM, the siamese pair split, ONNX export."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cramkit.model.students import BiLSTMConfig, BiLSTMStudent


def _student(pairs: bool = False) -> BiLSTMStudent:
    torch.manual_seed(0)
    cfg = BiLSTMConfig(
        vocab_size=100,
        embedding_dim=8,
        lstm_hidden=6,
        fc_hidden=5,
        dropout=0.0,
        pairs=pairs,
        pad_token_id=0,
        sep_token_id=3,
    )
    return BiLSTMStudent(cfg, 2).eval()


def test_final_states_equal_a_packed_bidirectional_lstm():
    m = _student()
    ref = nn.LSTM(8, 6, batch_first=True, bidirectional=True)
    state = dict(m.lstm_fwd.state_dict()) | {k + "_reverse": v for k, v in m.lstm_bwd.state_dict().items()}
    ref.load_state_dict(state)
    lengths = torch.tensor([7, 3, 5, 1])
    ids = torch.randint(4, 100, (4, 7)).masked_fill(torch.arange(7)[None] >= lengths[:, None], 0)
    packed = nn.utils.rnn.pack_padded_sequence(m.embedding(ids), lengths, batch_first=True, enforce_sorted=False)
    _, (h, _) = ref(packed)
    with torch.no_grad():
        assert torch.allclose(m.encode(ids, lengths), torch.cat([h[0], h[1]], -1), atol=1e-6)
        # padding does not change an example's output
        mask = torch.arange(7)[None] < lengths[:, None]
        _, padded = m(ids, mask)
        _, alone = m(ids[1:2, :3])
        assert torch.allclose(padded[1], alone[0], atol=1e-6)


def test_pairs_are_split_at_the_first_sep_and_read_by_the_same_lstm():
    m = _student(pairs=True)
    a, b = [2, 10, 11, 12, 3], [20, 21, 3]  # [CLS] a [SEP] | b [SEP]
    ids = torch.tensor([a + b + [0, 0]])
    mask = torch.tensor([[True] * 8 + [False] * 2])
    with torch.no_grad():
        _, logits = m(ids, mask)
        h1 = m.encode(torch.tensor([a]), torch.tensor([5]))
        h2 = m.encode(torch.tensor([b]), torch.tensor([3]))
        feats = torch.cat([h1, h2, h1 * h2, (h1 - h2).abs()], -1)
        want = m.classifier(F.relu(m.hidden(feats)))
    assert torch.allclose(logits, want, atol=1e-6)


@pytest.mark.slow
def test_bilstm_student_exports_to_onnx(distilled, tmp_path):
    from cramkit.cli import main

    assert main(["export", str(distilled["bilstm"][0]), "--format", "onnx", "--out", str(tmp_path / "x")]) == 0
    assert (tmp_path / "x").is_dir()


def test_principal_components_keep_the_geometry_of_a_low_rank_table():
    """A table whose rows vary along 5 directions, reduced to 5 dims: distances between rows are kept
    (up to the rescaling to the original root-mean-square value); fewer dims lose them."""
    from cramkit.distillation.students import principal_components

    g = torch.Generator().manual_seed(0)
    table = torch.randn(200, 5, generator=g) @ torch.randn(5, 32, generator=g) + torch.randn(32, generator=g)
    out = principal_components(table, 5)
    assert out.shape == (200, 5) and out.dtype == table.dtype

    def dist(x):
        return torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")

    d_in, d_out = dist(table), dist(out)
    ratio = d_out[d_in > 0] / d_in[d_in > 0]
    assert torch.allclose(ratio, ratio.mean().expand_as(ratio), rtol=1e-4)
    centred = table - table.mean(0)
    assert torch.isclose(out.pow(2).mean(), centred.pow(2).mean(), rtol=1e-4)
    low = principal_components(table, 2)
    ratio2 = dist(low)[d_in > 0] / d_in[d_in > 0]
    assert ratio2.std() > 0.05  # two dims cannot keep five dims' distances
