"""TimesFM's prediction models with their series given as one batch x steps tensor, swapped while
torch.export captures for a form that computes the same forecast for the whole batch at once.

``TimesFmModelForPrediction.forward`` and ``TimesFm2_5ModelForPrediction.forward`` take a list of 1-D
series and walk it in Python: the last ``forecast_context_len`` steps of each (``ts[-n:] for ts in
past_values``), the minimum of each, and ``_preprocess``'s pad-front-or-truncate of each to the context
length. Given a tensor they iterate its rows, so torch.export specialises the batch, and the branch on each
row's length specialises the steps. Every row of a tensor has the same length, so the same work is one
operation on the batch:

- the last ``n`` steps front-padded with zeros to ``n``: ``cat(zeros(batch, n), values)``'s last ``n``
  columns (``n`` the smaller of ``forecast_context_len`` and the length ``_preprocess`` pads to), whatever
  the steps; the padding indicator the same way from ones and zeros, the horizon's zeros after it;
- the minimum (``truncate_negative``'s test) over the real steps of the whole batch, the front padding
  read as +inf;
- TimesFM's ``freq`` defaulting to class 0 for each row.

The decoder runs on that tensor as transformers runs it, with two exceptions. TimesFM's
(``TimesFmModel.forward``), with ``use_positional_embedding``, concatenates a Python list of its positional
embedding as long as the batch, and shifts it with a boolean index assignment: ``timesfm_decoder``
broadcasts it and shifts it with ``torch.where``. TimesFM 2.5's decoder (``TimesFm2_5Model.forward``)
walks its patches in Python, updating a running mean and deviation patch by patch (Welford's
combination): 512 patches at the real context of 16384 steps, each a dozen operations, captured twice
(the flip-invariant forecast runs the decoder on the negated series too). ``running_patch_stats`` computes
the same statistics of every prefix of patches with cumulative sums: each patch's valid count, mean and
sum of squared deviations, combined as Welford's step combines them (the deviations of the patch means
from the prefix's mean added to the patches' own), so no large sum of squares is subtracted.

What the forms do not cover (``window_size``'s trend decomposition, which doubles the rows;
``future_values``' loss) is refused with a CaptureError naming it. A list of series is passed to
transformers' forward unchanged. Only the modules already imported are swapped (model_swaps.py), for
the duration of the capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import Forms, as_transformers_forward, swapped_forms
from fastonnx.errors import CaptureError


def _non_negative(
    mean: torch.Tensor, full: torch.Tensor, minimum: torch.Tensor, truncate: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``truncate_negative``: the forecasts clamped at 0 where every input value is, as transformers does."""
    if not truncate:
        return mean, full
    clamp = minimum >= 0
    return torch.where(clamp, mean.clamp_min(0.0), mean), torch.where(clamp, full.clamp_min(0.0), full)


def _refuse_uncovered(name: str, options: dict[str, Any]) -> None:
    for option, value in options.items():
        if value is not None:
            raise CaptureError(
                f"{name} is captured for a batch x steps past_values without {option!r} (its batched form "
                f"does not compute it); export it with {option}=None"
            )


def _front_padded(values: torch.Tensor, kept: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's last ``kept`` steps (all of them where fewer), front-padded with zeros to ``length``
    (>= ``kept``), and the padding indicator (1 on the padding, 0 on the steps), both ``values``' dtype:
    ``_preprocess`` of the rows cut to their last ``kept`` steps, without a branch on the steps."""
    batch, steps = values.shape[0], values.shape[1]
    zeros = values.new_zeros(batch, length)
    series = torch.cat([zeros, values], dim=1).narrow(1, steps + length - kept, kept)
    padding = torch.cat([values.new_ones(batch, length), values.new_zeros(batch, steps)], dim=1)
    padding = padding.narrow(1, steps + length - kept, kept)
    if kept < length:  # the rows were cut shorter than the context: _preprocess pads them to it
        series = torch.cat([values.new_zeros(batch, length - kept), series], dim=1)
        padding = torch.cat([values.new_ones(batch, length - kept), padding], dim=1)
    return series, padding


def _real_minimum(series: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """The smallest real step of the batch (the minimum of each row's minimum), padding ignored."""
    return torch.where(padding > 0.5, torch.inf, series).amin()


def _freq_rows(freq: Any, batch: Any, device: torch.device) -> torch.Tensor:
    """``_preprocess``'s frequency column: the given classes of the first ``batch`` rows, else 0s."""
    if freq is None:
        return torch.zeros(batch, 1, dtype=torch.int32, device=device)
    if not isinstance(freq, torch.Tensor):
        freq = torch.tensor(list(freq), device=device)
    rows: torch.Tensor = freq[:batch]
    return rows.to(torch.int32).reshape(-1, 1)


def timesfm_batched_forecast(
    self: Any,
    past_values: torch.Tensor,
    freq: Any = None,
    window_size: int | None = None,
    future_values: torch.Tensor | None = None,
    forecast_context_len: int | None = None,
    return_forecast_on_context: bool = False,
    truncate_negative: bool = False,
    **kwargs: Any,
) -> Any:
    """``TimesFmModelForPrediction.forward`` of a batch x steps ``past_values``, the rows as one tensor."""
    from transformers.models.timesfm.modeling_timesfm import TimesFmOutputForPrediction

    _refuse_uncovered(type(self).__name__, {"window_size": window_size, "future_values": future_values})
    fcontext_len = self.context_len if forecast_context_len is None else forecast_context_len
    horizon, patch = self.horizon_len, self.config.patch_length
    # the rows cut to their last fcontext_len steps, then padded or cut to self.context_len
    input_ts, input_padding = _front_padded(
        past_values, min(fcontext_len, self.context_len), self.context_len
    )
    inp_min = _real_minimum(input_ts, input_padding)
    input_padding = torch.cat(
        [input_padding, input_padding.new_zeros(input_padding.shape[0], horizon)], dim=1
    )
    inp_freq = _freq_rows(freq, past_values.shape[0], past_values.device)

    final_out = input_ts
    context_len = final_out.shape[1]
    full_outputs = []
    output_patch_len = self.config.horizon_length
    decoder_output: Any = None
    for step_index in range((horizon + output_patch_len - 1) // output_patch_len):
        current_padding = input_padding[:, 0 : final_out.shape[1]]
        decoder_output = self.decoder(
            past_values=final_out[:, -fcontext_len:],
            past_values_padding=current_padding[:, -fcontext_len:],
            freq=inp_freq,
            **kwargs,
        )
        fprop_outputs = self._postprocess_output(
            decoder_output.last_hidden_state, (decoder_output.loc, decoder_output.scale)
        )
        if return_forecast_on_context and step_index == 0:
            on_context = fprop_outputs[:, :-1, :patch, :]
            full_outputs.append(on_context.reshape(on_context.size(0), -1, on_context.size(3)))
        full_outputs.append(fprop_outputs[:, -1, :output_patch_len, :])
        final_out = torch.cat([final_out, fprop_outputs[:, -1, :output_patch_len, 0]], dim=-1)

    kept = context_len - patch + horizon if return_forecast_on_context else horizon
    full = torch.cat(full_outputs, dim=1)[:, :kept, :]
    mean = full[:, :, 0]
    mean, full = _non_negative(mean, full, inp_min, truncate_negative)
    return TimesFmOutputForPrediction(
        last_hidden_state=decoder_output.last_hidden_state,
        attentions=decoder_output.attentions,
        hidden_states=decoder_output.hidden_states,
        mean_predictions=mean,
        full_predictions=full,
        loss=None,
    )


def timesfm2_5_batched_forecast(
    self: Any,
    past_values: torch.Tensor,
    window_size: int | None = None,
    future_values: torch.Tensor | None = None,
    forecast_context_len: int | None = None,
    truncate_negative: bool | None = None,
    force_flip_invariance: bool | None = None,
    **kwargs: Any,
) -> Any:
    """``TimesFm2_5ModelForPrediction.forward`` of a batch x steps ``past_values``, the rows as one
    tensor."""
    from transformers.models.timesfm2_5.modeling_timesfm2_5 import TimesFm2_5OutputForPrediction

    _refuse_uncovered(type(self).__name__, {"window_size": window_size, "future_values": future_values})
    context = forecast_context_len or self.context_len
    config = self.config
    truncate_negative = config.infer_is_positive if truncate_negative is None else truncate_negative
    flip = config.force_flip_invariance if force_flip_invariance is None else force_flip_invariance
    # the rows cut to their last `context` steps, then padded to it (_preprocess's context_len)
    input_ts, real_padding = _front_padded(past_values, context, context)
    input_min = _real_minimum(input_ts, real_padding)
    input_padding = torch.cat(
        [real_padding, real_padding.new_zeros(real_padding.shape[0], self.horizon_len)], 1
    )

    mu_global = input_ts.mean(dim=1, keepdim=True)
    sigma_global = input_ts.std(dim=1, keepdim=True)
    normalized_ts = self.model._revin(input_ts, mu_global, sigma_global, reverse=False)
    pf_outputs, quantile_spreads, model_outputs = self._decode_and_project(
        normalized_ts, input_padding, **kwargs
    )
    if flip:
        flipped_pf, flipped_qs, _ = self._decode_and_project(-normalized_ts, input_padding, **kwargs)

        def flipped(x: torch.Tensor) -> torch.Tensor:  # the quantiles reversed, the mean kept
            return torch.cat([x[..., :1], torch.flip(x[..., 1:], dims=(-1,))], dim=-1)

        pf_outputs = (pf_outputs - flipped(flipped_pf)) / 2
        quantile_spreads = (quantile_spreads - flipped(flipped_qs)) / 2

    horizon = min(self.horizon_len, pf_outputs.shape[1])
    forecast = pf_outputs[:, :horizon, :].clone()
    median = min(config.decode_index, forecast.shape[-1] - 1)
    if config.use_continuous_quantile_head:
        spread_horizon = min(horizon, quantile_spreads.shape[1])
        for idx in range(1, len(config.quantiles) + 1):
            if idx == median or idx >= forecast.shape[-1]:
                continue
            forecast[:, :spread_horizon, idx] = (
                quantile_spreads[:, :spread_horizon, idx]
                - quantile_spreads[:, :spread_horizon, median]
                + forecast[:, :spread_horizon, median]
            )
    full = self.model._revin(forecast, mu_global, sigma_global, reverse=True)
    mean = full[:, :, min(config.decode_index, full.shape[-1] - 1)]
    mean, full = _non_negative(mean, full, input_min, truncate_negative)
    return TimesFm2_5OutputForPrediction(
        last_hidden_state=model_outputs.last_hidden_state,
        hidden_states=model_outputs.hidden_states,
        attentions=model_outputs.attentions,
        mean_predictions=mean,
        full_predictions=full,
        loss=None,
    )


def running_patch_stats(values: torch.Tensor, masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and (population) deviation of the valid values (``masked`` False) of every prefix of
    patches, batch x patches x patch length -> batch x patches each: what ``TimesFm2_5Model.forward``'s
    loop of ``_update_running_stats`` stacks, 0 for a prefix with no valid value."""
    valid = (~masked).to(values.dtype)
    count = valid.sum(dim=-1)
    safe = torch.where(count == 0, torch.ones_like(count), count)
    patch_mean = (values * valid).sum(dim=-1) / safe
    squares = (((values - patch_mean.unsqueeze(-1)) * valid) ** 2).sum(dim=-1)
    total = count.cumsum(dim=-1)
    total_safe = torch.where(total == 0, torch.ones_like(total), total)
    mean = (count * patch_mean).cumsum(dim=-1) / total_safe
    # Welford's combination: the patches' own squared deviations plus each patch's count times its mean's
    # squared deviation from the prefix's mean (sum c_i (m_i - M)^2 = sum c_i m_i^2 - N M^2)
    spread = (count * patch_mean * patch_mean).cumsum(dim=-1) - total * mean * mean
    variance = (squares.cumsum(dim=-1) + spread) / total_safe
    std = torch.sqrt(torch.clamp(variance, min=0.0))
    empty = total == 0
    return torch.where(empty, 0.0, mean), torch.where(empty, 0.0, std)


def timesfm2_5_decoder(
    self: Any, past_values: torch.Tensor, past_values_padding: torch.Tensor | None = None, **kwargs: Any
) -> Any:
    """``TimesFm2_5Model.forward`` with its running statistics from ``running_patch_stats``, not a
    Python loop over the patches."""
    from transformers.masking_utils import create_causal_mask
    from transformers.models.timesfm2_5.modeling_timesfm2_5 import TimesFm2_5Output

    batch_size, seq_len = past_values.shape
    patch_len = self.config.patch_length
    if past_values_padding is None:
        past_values_padding = torch.zeros_like(past_values, dtype=torch.long)
    patched_inputs = past_values.view(batch_size, -1, patch_len)
    masked = past_values_padding[:, :seq_len].view(batch_size, -1, patch_len) >= 0.5
    context_mu, context_sigma = running_patch_stats(patched_inputs, masked)

    normed_inputs = self._revin(patched_inputs, context_mu, context_sigma, reverse=False, mask=masked)
    embeddings = self.input_ff_layer(torch.cat([normed_inputs, masked.to(dtype=normed_inputs.dtype)], dim=-1))
    patch_padding = masked[..., -1]
    num_masked = patch_padding.to(torch.int32).sum(dim=-1, keepdim=True)
    position_ids = torch.arange(embeddings.shape[1], device=embeddings.device).unsqueeze(0) - num_masked
    padding_mask = (~patch_padding).to(torch.int64)
    attention_mask = create_causal_mask(self.config, embeddings, padding_mask, past_key_values=None)
    position_embeddings = self.rotary_emb(embeddings, position_ids)
    hidden_states = embeddings
    for layer in self.layers:
        hidden_states = layer(
            hidden_states,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **kwargs,
        )
    return TimesFm2_5Output(
        last_hidden_state=hidden_states,
        loc=context_mu[:, -1],
        scale=torch.clamp(context_sigma[:, -1], min=self.tolerance),
        context_mu=context_mu,
        context_sigma=context_sigma,
    )


def timesfm_decoder(
    self: Any, past_values: torch.Tensor, past_values_padding: torch.Tensor, freq: torch.Tensor, **kwargs: Any
) -> Any:
    """``TimesFmModel.forward`` with its positional embedding (``use_positional_embedding``) broadcast to
    the batch, not concatenated from a Python list of the batch's length, and shifted to each row's
    first real patch by ``torch.where``, not a boolean index assignment."""
    from transformers.models.timesfm.modeling_timesfm import TimesFmOutput

    config = self.config
    batch = past_values.shape[0]
    patched_inputs = past_values.view(batch, -1, config.patch_length)
    patched_pads = past_values_padding.view(batch, -1, config.patch_length)
    zero = torch.full((), 0.0, dtype=patched_inputs.dtype, device=patched_inputs.device)
    patched_inputs = torch.where(torch.abs(patched_pads - 1.0) < config.tolerance, zero, patched_inputs)
    one = torch.full((), 1.0, dtype=patched_pads.dtype, device=patched_pads.device)
    patched_pads = torch.where(
        torch.abs(patched_inputs - config.pad_val) < config.tolerance, one, patched_pads
    )
    patched_inputs, stats = self._forward_transform(patched_inputs, patched_pads)
    patched_inputs = patched_inputs * (1.0 - patched_pads)
    model_input = self.input_ff_layer(torch.cat([patched_inputs, patched_pads], dim=-1))
    patched_padding = torch.min(patched_pads, dim=-1)[0]  # a patch with one real value is real
    if config.use_positional_embedding:
        pos_emb = self.position_emb(model_input.shape[1]).expand(batch, -1, -1)
        model_input = model_input + _shifted_to_first_real(patched_padding, pos_emb)
    model_input = model_input + self.freq_emb(freq)
    attention_mask = self._prepare_4d_attention_mask(
        attention_mask=patched_padding,
        sequence_length=model_input.shape[1],
        dtype=model_input.dtype,
        device=model_input.device,
        is_causal=True,
    )
    hidden_states = model_input
    for layer in self.layers[: config.num_hidden_layers]:
        hidden_states = layer(
            hidden_states, attention_mask=attention_mask, paddings=patched_padding, **kwargs
        )
    return TimesFmOutput(last_hidden_state=hidden_states, loc=stats[0], scale=stats[1])


def _shifted_to_first_real(mask: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """``TimesFmModel._timesfm_shift_padded_seq``: each row of ``seq`` (batch x patches x features)
    rotated right by the index of its first unpadded patch of ``mask`` (-1 where every patch is padded)."""
    batch, patches, features = seq.shape
    real = mask == 0
    first = torch.where(real.any(dim=1), real.to(torch.int32).argmax(dim=1), -1)
    positions = torch.arange(patches, device=seq.device).view(1, -1, 1).expand(batch, -1, features)
    return seq.gather(1, (positions - first[:, None, None]) % patches)


def _on_tensor_rows(form: Callable[..., Any], original: Any) -> Any:
    """The forward that runs ``form`` on a batch x steps ``past_values`` and ``original`` on anything
    else (a list of series: transformers' own loop), returning a tuple where ``return_dict`` is False as
    transformers' ``can_return_tuple`` does."""

    def forward(self: Any, past_values: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not (isinstance(past_values, torch.Tensor) and past_values.dim() == 2):
            return original(self, past_values, *args, **kwargs)
        return_dict = kwargs.pop("return_dict", None)
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        output = form(self, past_values, *args, **kwargs)
        return output if return_dict else output.to_tuple()

    return forward


PREDICTORS: Forms = {
    "timesfm": {"TimesFmModelForPrediction.forward": timesfm_batched_forecast},
    "timesfm2_5": {"TimesFm2_5ModelForPrediction.forward": timesfm2_5_batched_forecast},
}
"""transformers' model types and the ``Class.method``s swapped (model_swaps.py) for a tensor of rows."""

DECODERS: Forms = {
    "timesfm": {"TimesFmModel.forward": timesfm_decoder},
    "timesfm2_5": {"TimesFm2_5Model.forward": timesfm2_5_decoder},
}
"""The decoders swapped: TimesFM's positional embedding broadcast to the batch, TimesFM 2.5's loop over
the patches as cumulative statistics."""


@contextlib.contextmanager
def batched_forecasts() -> Iterator[None]:
    """While active, the loaded modules of ``PREDICTORS`` and ``DECODERS`` have their batched forms."""
    with swapped_forms(PREDICTORS, _on_tensor_rows), swapped_forms(DECODERS, as_transformers_forward):
        yield
