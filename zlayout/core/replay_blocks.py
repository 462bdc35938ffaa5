"""One block's requests for the allocator replay (core/allocator_sim.py): the seam
`forward(x, first)`, `recompute(x)` and `backward(saved, g, hook)`, written by hand
(`HandBlocks`: zlayout's GPT, transformers' Llama-class decoder layer, Mixtral's MoE block) or
taken from a learned model card (`CardBlocks`). `hook` is DeepSpeed's gradient hook, called
with each weight gradient as it is made (core/replay_grads.py)."""

from __future__ import annotations

from bisect import bisect_right
from itertools import islice

from zlayout.core.caching_allocator import _SIZE_SHIFT, DEFAULT_STREAM, SMALL_SIZE
from zlayout.core.card import FREED_OUTSIDE
from zlayout.core.reductions import REDUCTION_EVENTS, Device, bias_gradient_scratch
from zlayout.core.replay_state import Replay, _Seq


class LeafGradients:
    """DeepSpeed's gradient hook (`hook`) as ZeRO-3 calls it for a leaf module's weights
    (tensors.zero3_leaf_moe_tensor_sizes: a sparse MoE block). stage3.py
    create_reduce_and_remove_grad_hooks registers no hook on them; the block's full backward
    hook (reduce_leaf_module_grads), which runs once the block's input gradient is made, hands
    each of their gradients to reduce_ready_partitions_and_remove_grads in parameter order. So a
    gradient of one of `sizes` (bytes, in parameter order) is held until all of them have come
    (the last one autograd makes, the router's, comes as the block's backward ends), then all go
    to `hook` in that order; any other gradient, and any after those, go straight to `hook`.
    Mixtral-8x22B trace (h200-2026-12-03b): the 3072 MiB gate/up and 1536 MiB down gradients both
    alive while the first is reduced (its fp32 cast: the step's peak), the head's bucket reduced
    only then."""

    def __init__(self, s: _Seq, w: int, sizes: tuple[int, ...], hook) -> None:
        self.s, self.w, self.sizes, self.hook = s, w, sizes, hook
        self.waiting = list(sizes)
        self.held: dict[int, list[tuple[list[int], int]]] = {}

    def __call__(self, weight_grads: list[int], small: int = 0) -> None:
        size = self.s.sizes[weight_grads[0]] if weight_grads else small * self.w
        if size not in self.waiting:
            self.hook(weight_grads, small)
            return
        self.waiting.remove(size)
        self.held.setdefault(size, []).append((weight_grads, small))
        if not self.waiting:
            self.release()

    def release(self) -> None:
        """The block's backward hook: every gradient held, in parameter order."""
        self.waiting = []
        for size in self.sizes:
            if self.held.get(size):
                self.hook(*self.held[size].pop(0))


class HandBlocks:
    """The hand-written blocks, checked request by request against H200 allocator traces
    (allocator_sim's docstring). The norms and `linear_backward` also serve the final norm and
    the head (allocator_sim's head phases)."""

    def __init__(self, r: Replay) -> None:
        model, t = r.model, r.t
        self.s, self.model, self.w, self.T = r.s, model, r.w, r.T
        self.device = r.device  # a bias gradient's reduction scratch is sized for it
        self.h, self.kv, self.f = r.h, r.kv, r.f
        self.hf, self.hf_norm, self.ckpt = r.hf, r.hf_norm, r.ckpt
        self.swiglu = model.mlp == "swiglu"
        self.moe = model.is_moe
        self.first_matmul = r.first_matmul
        # zlayout's GPT's Linears with a bias (worker_model.Block: qkv per qkv_bias; proj, fc1 and
        # fc2 per bias); transformers' classes have their own backward below
        self.qkv_biased = not r.hf and model._biased(model.qkv_bias)
        self.gpt_biased = not r.hf and model.bias
        self.E, self.top_k = model.experts, model.top_k or 0
        self.leaf = r.leaf_gradients
        self.S = r.T * self.top_k  # (token, expert) pairs
        heads = model.heads
        seq_rounded = 128 * -(-t.seq // 128)
        # flash attention's backward workspace, freed when it returns: the fp32 dq accumulator
        # (b, s, heads, head_dim) and the (b, heads, s) softmax sums, and with fewer key/value
        # heads than query heads the bf16 dk/dv expanded to every query head before they are
        # summed per group (flash_api.cpp mha_bwd: dk_expanded, dv_expanded when num_heads_k !=
        # num_heads). Traces: 129.0 MiB at b2 s4096 h2048 32 heads / 8 kv heads, 192.8 MiB at
        # h3072 24/8, 64.5 MiB at b2 s2048 h4096 32/32 (z3-opt-param-cpu)
        gqa = model.num_kv_heads != heads
        self.flash_bwd = t.micro_batch * seq_rounded * ((8 if gqa else 4) * model.q_size + 4 * heads)

    def norm_forward(self) -> tuple[list[int], int]:
        """A norm: (tensors its backward keeps, its output)."""
        s, w, T, h, hf_norm = self.s, self.w, self.T, self.h, self.hf_norm
        if hf_norm:
            # transformers' RMSNorm: x.float() (kept), pow (transient), x * rsqrt (fp32,
            # transient), .to(bf16) (kept by the weight multiply), weight * that (output)
            # (the fp32 product stays bound to the local `hidden_states` until the function
            # returns: freed after the output is made; traces t-z1-hf-v32001, t-z2-hf-ckpt-s8192:
            # 64, 64, -64, 64, 32, 32, -64 MiB at b2 s4096 h2048)
            x32 = s.a(T * h * 4)
            s.transient(T * h * 4)
            n32 = s.a(T * h * 4)
            nb = s.a(T * h * w)
            out = s.a(T * h * w)
            s.f(n32)
            return [x32, nb], out
        return [], s.a(T * h * w)

    def moe_forward(self, sv: dict, recompute: bool) -> int | None:
        """MixtralSparseMoeBlock.forward on the post-attention norm's output (modeling_mixtral.py,
        transformers 5.24; experts by `grouped_mm_experts_forward`, integrations/moe.py, the
        default: PreTrainedModel.get_correct_experts_implementation resolves None to
        "grouped_mm" for a class decorated @use_experts_implementation), then the residual
        add. Saved for backward: the fp32 router probabilities, the top-k indices and sums,
        the sort permutation, the gathered input (S x hidden), the sorted routing weights,
        the gate/up output (S x 2 ffn), SiLU's output, the product, the down output (S x
        hidden), the inverse permutation. With `recompute` the checkpoint stops after the
        inverse permutation, the last tensor saved (IndexBackward0 saves its indices before
        it runs): no un-permuted copy, sum or output. Request order checked against
        torch.profiler's CPU memory events of the block (torch 2.13, bf16)."""
        s, w, T, h, f, E, top_k, S = self.s, self.w, self.T, self.h, self.f, self.E, self.top_k, self.S
        # MixtralTopKRouter: F.linear (bf16 logits), .float(), softmax (kept), topk (values,
        # int64 indices), values /= values.sum(-1) (the sum kept by DivBackward)
        logits = s.a(T * E * w)
        l32 = s.a(T * E * 4)
        probs = s.a(T * E * 4)
        s.f(l32)
        top_v, top_i, top_sum = s.a(T * top_k * 4), s.a(T * top_k * 8), s.a(T * 4)
        # grouped_mm_experts_forward: sort the S expert ids (sorted ids, permutation),
        # perm // top_k (IndexBackward0's index, kept), hidden_states[...] (S x hidden,
        # kept by the grouped mm), sample_weights[perm] (fp32, kept), histc's int32 input
        ids_g, perm = s.a(S * 8), s.a(S * 8)
        pk = s.a(S * 8)
        sel = s.a(S * h * w)
        sw = s.a(S * 4)
        s.transient(S * 4)
        proj = s.a(S * 2 * f * w)  # gate/up grouped mm
        act = s.a(S * f * w)  # _default_apply_gate: act_fn(gate) * up
        prod = s.a(S * f * w)
        down = s.a(S * h * w)  # down grouped mm
        weighted = s.a(S * h * 4)  # proj_out * sample_weights_g: bf16 x fp32 -> fp32
        inv = s.a(S * 8)  # inv_perm = empty_like(perm); inv_perm[perm] = arange
        s.transient(S * 8)
        sv["moe_router"] = [probs, top_i, top_sum, perm, sw]
        sv["moe_pk"], sv["moe_sel"], sv["moe_proj"] = [pk], [sel], [proj]
        sv["act"], sv["prod"], sv["fc1"] = [act], [prod], []
        sv["moe_down"], sv["moe_inv"] = [down], [inv]
        if recompute:
            s.f(weighted, logits, top_v, ids_g)
            return None
        unperm = s.a(S * h * 4)  # weighted_out[inv_perm]
        s.f(weighted)
        sum32 = s.a(T * h * 4)  # .view(tokens, top_k, hidden).sum(1)
        moe_out = s.a(T * h * w)  # .to(bf16)
        s.f(unperm, sum32, logits, top_v, ids_g)
        out = s.a(T * h * w)  # residual + hidden_states
        s.f(moe_out)
        return out

    def moe_backward(self, sv: dict, g: int, hook) -> int:
        """The MoE block's backward from g (its output's gradient, also the residual's), as
        autograd runs it (engine order: highest sequence number first; each node's inputs
        and saved tensors freed before the next node, AccumulateGrad (DeepSpeed's hook)
        right after the node that made the weight's gradient). Returns the gradient of the
        norm's output (the router's input gradient added in place into the experts').
        At ZeRO-3 the block is a leaf module: its gradients go to DeepSpeed together at its
        end (`LeafGradients`)."""
        s, w, T, h, f, E, S = self.s, self.w, self.T, self.h, self.f, self.E, self.S
        if self.leaf:
            hook = LeafGradients(s, w, self.leaf, hook)
        g32 = s.a(T * h * 4)  # ToCopyBackward0
        gs = s.a(S * h * 4)  # SumBackward1's expand, reshaped by ViewBackward0 (a copy)
        s.f(g32)
        gi = s.a(S * h * 4)  # IndexBackward0: zeros, index_put_ (accumulate)
        s.f(gs, *sv["moe_inv"])
        # MulBackward0: d(down) = g * weights (fp32, cast to bf16), d(weights) = g * down
        # (fp32, summed to S x 1)
        gd32, gw32 = s.a(S * h * 4), s.a(S * h * 4)
        gd = s.a(S * h * w)
        s.f(gd32, gw32, gi, *sv["moe_down"])
        # GroupedMmBackward0 (down): the 3D weight's gradient, then the input's
        wg = s.a(E * f * h * w)
        gp = s.a(S * f * w)
        s.f(gd, *sv["prod"])
        hook([wg])
        ga, gu = s.a(S * f * w), s.a(S * f * w)  # MulBackward0: d(act), d(up)
        s.f(gp, *sv["act"])
        gg = s.a(S * f * w)  # SiluBackward0
        s.f(ga, *sv["moe_proj"])
        gcat = s.a(S * 2 * f * w)  # SplitBackward0 (chunk): cat
        s.f(gg, gu)
        wg = s.a(E * 2 * f * h * w)  # GroupedMmBackward0 (gate/up)
        gsel = s.a(S * h * w)
        s.f(gcat, *sv["moe_sel"])
        hook([wg])
        gx = s.a(T * h * w)  # IndexBackward0 (hidden_states[perm // top_k]): zeros, index_put_
        s.f(gsel, *sv["moe_pk"])
        # the router: routing weights' gathers, DivBackward0, TopkBackward0 (zeros T x
        # experts fp32), SoftmaxBackward0, ToCopyBackward0 (bf16), the router's Linear
        gt = s.a(T * E * 4)
        gsm = s.a(T * E * 4)
        s.f(gt, *sv["moe_router"])
        gl = s.a(T * E * w)
        s.f(gsm)
        gr = self.linear_backward(E * h, T * h * w, hook)
        s.f(gl)
        s.f(gr)  # added into the experts' input gradient in place
        return gx

    def rotary(self, size: int) -> int:
        """apply_rotary_pos_emb on one of q, k (`size` bytes): x * cos, rotate_half(x) =
        cat(-x2, x1) (the negated half, then the cat), that * sin, the sum."""
        s = self.s
        xc = s.a(size)
        neg = s.a(size // 2)
        cat = s.a(size)
        s.f(neg)
        xs = s.a(size)
        s.f(cat)
        out = s.a(size)
        s.f(xc, xs)
        return out

    def hf_rotated_qkv(self) -> tuple[int, int, int]:
        """A transformers attention's q, k and v projections and apply_rotary_pos_emb(q, k):
        autograd keeps only cos and sin, so each rotary's intermediates (the negated half and the
        cat included) die inside it; q and k stay bound to the attention's locals until both are
        rotated (t-z1-hf-v256000 trace: 18, 9, 18, -9, 18, -18, 18, -18, -18 MiB for q at b2
        s2048 h2304). Returns the rotated q and k, and v."""
        s, w, T, h, kv, first_matmul = self.s, self.w, self.T, self.h, self.kv, self.first_matmul
        q = s.a(T * h * w)
        first_matmul("forward")
        k, v = s.a(T * kv * w), s.a(T * kv * w)
        qr = self.rotary(T * h * w)
        kr = self.rotary(T * kv * w)
        s.f(q, k)
        return qr, kr, v

    def hf_norm_no_saves(self, x: int) -> int:
        """transformers' RMSNorm when autograd saves nothing: the fp32 copy dies when the
        local is rebound to its product with rsqrt, that product when the function returns."""
        s, w, T, h = self.s, self.w, self.T, self.h
        x32 = s.a(T * h * 4)
        s.transient(T * h * 4)  # pow
        n32 = s.a(T * h * 4)
        s.f(x32)
        nb = s.a(T * h * w)
        out = s.a(T * h * w)
        s.f(nb, n32)
        return out

    def hf_block_forward_checkpointed(self, x: int) -> int:
        """A transformers decoder layer's forward inside torch.utils.checkpoint (non-reentrant):
        nothing is saved, so every intermediate dies at its last use, when the Python local
        holding it is rebound or its function returns; only the layer's input is kept, by the
        checkpoint. Order from the t-z2-hf-ckpt-s8192 trace (per layer, MiB at s8192 h2048 kv
        1024 ffn 5632: norm 64 64 -64 64 -64 32 32 -32 -64; q 32, k 16, v 16; the two rotaries;
        -32 -16 the unrotated q and k; sdpa 32, o_proj 32, -32 -32 -16 -16 the attention's
        locals, -32 the norm's output, 32 the residual add, -32; the MLP: gate 88, silu 88,
        -88, up 88, product 88, -88 -88, down 32, -88, -32, 32 the residual add, -32 -32)."""
        s, w, T, h, f = self.s, self.w, self.T, self.h, self.f
        n1 = self.hf_norm_no_saves(x)
        qr, kr, v = self.hf_rotated_qkv()
        attn = s.a(T * h * w)
        proj = s.a(T * h * w)
        s.f(attn, qr, kr, v, n1)
        xm = s.a(T * h * w)
        s.f(proj)
        n2 = self.hf_norm_no_saves(xm)
        gate = s.a(T * f * w)
        act = s.a(T * f * w)
        s.f(gate)
        up = s.a(T * f * w)
        prod = s.a(T * f * w)
        s.f(act, up)
        down = s.a(T * h * w)
        s.f(prod, n2)
        out = s.a(T * h * w)
        s.f(down, xm)
        return out

    def block_forward(self, x: int, keep: bool, recompute: bool = False,
                      input_dies: bool = True) -> tuple[dict, int | None]:
        """One block's forward from its input x: (what its backward keeps, its output).
        `recompute`: a checkpoint's recomputation in backward, which stops once the last
        tensor backward needs is made (torch.utils.checkpoint, non-reentrant, early stop on
        by default): fc2 and the residual add are not run again, no output (z2-ckpt trace:
        no 48 MiB fc2 output or sum between a layer's recomputed product and fc2's gradients)."""
        s, w, T, h, kv, f = self.s, self.w, self.T, self.h, self.kv, self.f
        hf, hf_norm, ckpt, swiglu, moe = self.hf, self.hf_norm, self.ckpt, self.swiglu, self.moe
        first_matmul = self.first_matmul
        sv: dict[str, list[int]] = {}
        sv["norm1"], n1 = self.norm_forward()
        sv["n1"] = [n1]
        if hf:
            sv["qkv"] = list(self.hf_rotated_qkv())
        else:
            sv["qkv"] = [s.a(T * (h + 2 * kv) * w)]
            first_matmul("forward")
        sv["attn"] = [s.a(T * h * w)]
        proj = s.a(T * h * w)
        xm = s.a(T * h * w)
        s.f(proj)
        if ckpt:
            sv["x"] = []  # the checkpoint keeps the block's input
        elif hf_norm:
            sv["x"] = []  # the norm keeps its fp32 copy, not the block's input
        else:
            sv["x"] = [x]
        sv["norm2"], n2 = self.norm_forward()
        sv["n2"] = [n2]
        if moe:
            out = self.moe_forward(sv, recompute)
        else:
            if hf and swiglu:
                # down_proj(act_fn(gate_proj(x)) * up_proj(x)): gate, its SiLU, up
                gate = s.a(T * f * w)
                act = s.a(T * f * w)
                up = s.a(T * f * w)
                sv["fc1"] = [gate, up]
            else:
                fc1 = s.a(T * (2 if swiglu else 1) * f * w)
                act = s.a(T * f * w)
                sv["fc1"] = [fc1]
            sv["act"] = [act]
            if swiglu:
                sv["prod"] = [s.a(T * f * w)]
            else:
                sv["prod"] = []
            if recompute:
                out = None
            else:
                fc2 = s.a(T * h * w)
                out = s.a(T * h * w)
                s.f(fc2)
        if hf_norm:
            s.f(xm)
            if not ckpt and input_dies:
                # the block's input stays bound to the model loop's `hidden_states` until the
                # layer returns (t-z1-hf-v256000 trace: the down output, the residual, then the
                # input freed after each block's second residual add)
                s.f(x)
            sv["xm"] = []
        else:
            sv["xm"] = [xm]
        if not keep:
            for names in sv.values():
                s.f(*names)
            sv = {}
        return sv, out

    def linear_backward(self, weight: int, d_input: int, hook, biased: bool = False, dies: tuple = ()) -> int:
        """A Linear's backward. Without a bias (MmBackward): the weight's gradient, then the
        input's; the weight's gradient goes at once to its AccumulateGrad node, whose hook
        (DeepSpeed's reduce hook) runs before the next node (traces: 48 then 128 MiB at fc2,
        96 then 48 at fc1, the 48 freed into the reduce bucket before the activation gradients
        follow), then `dies` is freed. With one (AddmmBackward0): the input's
        gradient, then the weight's, the bias's gradient's reduction scratch (core.reductions:
        its size follows the GPU's multiprocessors), then `dies` (the incoming gradient and the
        saved input, in that order) before the weight's hook (w2-z0-L6-h2560 trace: +160 +50
        +132.5 -132.5 -160 at fc2; +40 +50 +135 -135, the 160 MiB incoming and the 40 MiB norm
        output freed at fc1)."""
        s, w = self.s, self.w
        if biased:
            gin = s.a(d_input)
            wgrad = s.a(weight * w)
            outputs = weight // (d_input // (self.T * w))  # the weight's rows: out x in elements
            s.transient(bias_gradient_scratch(outputs, self.T, self.device))
            s.f(*dies)
            hook([wgrad])
        else:
            wgrad = s.a(weight * w)
            gin = s.a(d_input)
            hook([wgrad])
            s.f(*dies)
        return gin

    def block_backward(self, sv: dict, g: int, hook) -> int:
        """One block's backward, as autograd runs it: each node frees what it kept when it
        is done, each weight gradient is handed to `hook` as it is made. g: the gradient of
        the block's output, which is also the residual stream's: the gradients of the two
        norms' branches are added into it in place (autograd's InputBuffer accumulates into a
        buffer it owns; the traces free the branch's gradient and keep g)."""
        s, w, T, h = self.s, self.w, self.T, self.h
        f, hf, swiglu, moe, gpt_biased = self.f, self.hf, self.swiglu, self.moe, self.gpt_biased
        if moe:
            gn = self.moe_backward(sv, g, hook)
            s.f(*sv["n2"])
            gxm = self.norm_backward(gn, sv["norm2"], sv["xm"], hook)
            s.f(gxm)  # added into g in place
            return self.attention_backward(sv, g, hook)
        if gpt_biased:
            # fc2 (its node frees its saved input, the activation's output, GELU's too)
            g1 = self.linear_backward(f * h, T * f * w, hook, True, tuple(sv["prod"] or sv["act"]))
        else:
            wg_fc2 = s.a(f * h * w)  # fc2: d(weight), then d(input)
            g1 = s.a(T * f * w)
            s.f(*(sv["prod"] or sv["act"][:0]))
            hook([wg_fc2])
        if hf and swiglu:
            # transformers' MLP (t-z1-hf-v256000 trace): MulBackward0 (up's gradient, then
            # act's; up and act freed with it); up_proj's MmBackward runs before the SiLU's
            # (made later in forward); gate_proj's input gradient is summed with up_proj's
            # (both views of a matmul: a new tensor) before its weight's hook, and the norm's
            # output, which both projections kept, dies with gate_proj's node
            gate, up = sv["fc1"]
            g_up, g_act = s.a(T * f * w), s.a(T * f * w)
            s.f(g1, up, *sv["act"])
            w_up = s.a(f * h * w)
            gx = s.a(T * h * w)
            s.f(g_up)
            hook([w_up])
            gs = s.a(T * f * w)  # SiluBackward0
            s.f(g_act, gate)
            w_gate = s.a(f * h * w)
            gx2 = s.a(T * h * w)
            s.f(gs, *sv["n2"])
            gn = s.a(T * h * w)
            s.f(gx, gx2)
            hook([w_gate])
            gxm = self.norm_backward(gn, sv["norm2"], sv["xm"], hook)
            s.f(gxm)  # added into g in place
            return self.attention_backward(sv, g, hook)
        if swiglu:
            # silu(gate) * up: MulBackward0 makes up's gradient, then silu's (as transformers'
            # MLP above; b7-z0-L6-h3072 trace: the second is freed by the silu's backward)
            gb, ga = s.a(T * f * w), s.a(T * f * w)
            s.f(g1, *sv["act"])
            gs = s.a(T * f * w)  # silu backward
            s.f(ga)
            s.f(*sv["fc1"])  # the fused gate/up output: its last use was the silu
            gcat = s.a(T * 2 * f * w)  # chunk backward: cat
            s.f(gs, gb)
        else:
            gcat = s.a(T * f * w)  # gelu backward: its input (fc1's output) freed
            s.f(g1, *([] if gpt_biased else sv["act"]), *sv["fc1"])
        gn = self.linear_backward((2 if swiglu else 1) * f * h, T * h * w, hook, gpt_biased,
                             (gcat, *sv["n2"]))  # fc1
        gxm = self.norm_backward(gn, sv["norm2"], sv["xm"], hook)
        s.f(gxm)  # added into g in place
        return self.attention_backward(sv, g, hook)

    def attention_backward(self, sv: dict, g: int, hook) -> int:
        """The attention half of a block's backward, from g (the residual's gradient)."""
        s, w, T, h = self.s, self.w, self.T, self.h
        kv, hf, gpt_biased, qkv_biased, flash_bwd = self.kv, self.hf, self.gpt_biased, self.qkv_biased, self.flash_bwd
        gattn = self.linear_backward(h * h, T * h * w, hook, gpt_biased)  # proj
        # sdpa backward: dq, dk, dv, flash's workspace
        dq, dk, dv = s.a(T * h * w), s.a(T * kv * w), s.a(T * kv * w)
        s.transient(flash_bwd)
        if hf:
            # transformers' attention (t-z1-hf-v256000 trace): the sdpa node frees its
            # incoming gradient, then the rotated k and q, v and its output; k's rotary runs
            # back before q's (made later), then v_proj, k_proj, q_proj (reverse order of
            # creation). k's and q's gradients come out of the rotary transposed and are
            # made contiguous for their projection's view; v_proj's and k_proj's input
            # gradients are summed into a new tensor (both views), q_proj's added into it in
            # place; each projection's weight hook runs once its input gradient is placed
            qr, kr, v = sv["qkv"]
            s.f(gattn, kr, qr, v, *sv["attn"])
            dk = self.rotary_backward(dk, T * kv * w)
            dq = self.rotary_backward(dq, T * h * w)
            w_v = s.a(h * kv * w)
            gv = s.a(T * h * w)
            s.f(dv)
            hook([w_v])
            kc = s.a(T * kv * w)
            s.f(dk)
            w_k = s.a(h * kv * w)
            gk = s.a(T * h * w)
            s.f(kc)
            gn = s.a(T * h * w)
            s.f(gv, gk)
            hook([w_k])
            qc = s.a(T * h * w)
            s.f(dq)
            w_q = s.a(h * h * w)
            gq = s.a(T * h * w)
            s.f(qc, *sv["n1"], gq)
            hook([w_q])
            gx = self.norm_backward(gn, sv["norm1"], sv["x"], hook)
            s.f(gx)  # added into g in place
            return g
        s.f(*sv["attn"], *sv["qkv"], gattn)
        gqkv = s.a(T * (h + 2 * kv) * w)  # split backward: cat
        s.f(dq, dk, dv)
        gn = self.linear_backward(h * (h + 2 * kv), T * h * w, hook, qkv_biased,
                             (gqkv, *sv["n1"]) if qkv_biased else (*sv["n1"], gqkv))
        gx = self.norm_backward(gn, sv["norm1"], sv["x"], hook)
        s.f(gx)  # added into g in place
        return g

    def rotary_backward(self, g: int, size: int) -> int:
        """apply_rotary_pos_emb's backward for one of q, k (`size` bytes) from its output's
        gradient g: rotate_half(x) * sin's product, the negated half, the two slices'
        zero-padded gradients (the second added into the first in place), x * cos's product
        added too (t-z1-hf-v256000 trace: 18, 9, 18, -9, 18, -18, -18, 18, -18, -18 MiB)."""
        s = self.s
        a1 = s.a(size)
        neg = s.a(size // 2)
        s2 = s.a(size)
        s.f(neg)
        s1 = s.a(size)
        s.f(a1, s1)
        y = s.a(size)
        s.f(g, y)
        return s2

    def norm_backward(self, g: int, kept: list[int], x: list[int], hook) -> int:
        s, model, w, T, h, hf_norm = self.s, self.model, self.w, self.T, self.h, self.hf_norm
        if hf_norm:
            # transformers' RMSNorm as autograd runs it back (traces t-z1-hf-v256000,
            # t-z1-hf-v32001: 18, 18, 72, then 36 x 7 and 18 MiB at b2 s2048 h2304).
            # MulBackward0 (weight * hb): hb's gradient, then the weight's product, which the
            # engine sums to the weight's shape (validate_outputs -> sum_to; the reduction
            # takes a transient of 8 bytes an element); g, the product and hb freed, then the
            # weight's AccumulateGrad and hook
            x32, nb = kept
            g_hb = s.a(T * h * w)
            gw = s.a(T * h * w)
            s.transient(T * h * 8)
            s.f(gw, g, nb)
            hook([], model.norm_params())
            g32 = s.a(T * h * 4)  # ToCopyBackward0: to fp32
            s.f(g_hb)
            # MulBackward0 (x32 * rsqrt): rsqrt's product (summed over h, freed), then x32's
            gr = s.a(T * h * 4)
            gx32 = s.a(T * h * 4)
            s.f(gr, g32)
            # MeanBackward0 (expand / h), PowBackward0 (x32.pow(1), * 2, * grad): x32 freed
            # with the pow's node, its product added into x32's gradient in place
            gm = s.a(T * h * 4)
            p1, p2, gp = s.a(T * h * 4), s.a(T * h * 4), s.a(T * h * 4)
            s.f(p2, p1, gm, x32, gp)
            gx = s.a(T * h * w)  # ToCopyBackward0: to bf16
            s.f(gx32)
            return gx
        # the norm's weight (and bias) gradient: too small for the large pool, but ZeRO-3
        # counts its elements into the reduce bucket
        hook([], model.norm_params())
        gx = s.a(T * h * w)
        # what the norm kept for its backward (the final norm's input, `fin_kept`) dies with it
        s.f(g, *x, *kept)
        return gx

    def forward(self, x: int, first: bool) -> tuple[dict, int | None]:
        """One block's forward as written above: (what its backward keeps, its output)."""
        hf_norm, ckpt, swiglu, moe = self.hf_norm, self.ckpt, self.swiglu, self.moe
        if ckpt and hf_norm and swiglu and not moe:
            return {}, self.hf_block_forward_checkpointed(x)
        # the first block's input is the model's `inputs_embeds`, alive to its return
        return self.block_forward(x, keep=not ckpt, input_dies=not first)

    def recompute(self, x: int) -> dict:
        """A checkpointed block's recompute in backward: what its backward keeps."""
        return self.block_forward(x, keep=True, recompute=True)[0]

    backward = block_backward


# `CardBlocks.program`'s opcodes
_ALLOC, _FREE, _TRANSIENT, _HOOK, _HOOK_SMALL, _OUTSIDE, _GROUP = range(7)


def _hook_op(size: int, slot: int) -> tuple[int, int, int]:
    """A weight gradient handed to the hook: a replayed one by its tensor, a small one by its
    elements."""
    return (_HOOK, size, slot) if size > SMALL_SIZE else (_HOOK_SMALL, size, slot)


def _held_above(run: list[tuple[int, int, int]]) -> int:
    """The most a closed run of requests holds at once above what was held before it (a skipped
    run's part of the replay's allocated peak, `_Seq.peak_allocated`)."""
    held = above = 0
    made: dict[int, int] = {}
    for op, size, slot in run:
        if op == _ALLOC:
            made[slot] = size
            held += size
            above = max(above, held)
        elif op == _TRANSIENT:
            above = max(above, held + size)
        elif op == _FREE:
            held -= made.pop(slot, 0)
    return above


def _closed_groups(code: list[tuple[int, int, int]]) -> list[tuple[int, int, object]]:
    """`code` with a (_GROUP, bytes << _SIZE_SHIFT, (length, sizes, Nones, Falses, held above)) instruction before
    each run of two or more instructions that allocate and free only tensors of their own (none
    made before them, none left after, no hook): such a run that makes no segment leaves the
    pool as it found it (free blocks are always merged, so the free bytes decide them), and it
    makes none where one free block holds every allocation in it with 1 MiB more each (each
    takes at most that of the block's free end, split or taken whole). `run_program` then
    skips the run, the names its tensors take (`sizes`) still taken. A card's phases are half
    such runs (Qwen3-8B's backward: 88 of 158 instructions)."""
    allocated_at = {slot: i for i, (op, _, slot) in enumerate(code) if op == _ALLOC}
    freed_at = {slot: i for i, (op, _, slot) in enumerate(code) if op == _FREE}
    out: list[tuple[int, int, object]] = []
    i = 0
    while i < len(code):
        op, _, slot = code[i]
        end = freed_at.get(slot, -1) if op == _ALLOC else -1
        j = i
        while j <= end:  # on until every tensor the run made is freed
            op, _, slot = code[j]
            if op == _ALLOC and slot in freed_at:
                end = max(end, freed_at[slot])
            elif not (op == _TRANSIENT or (op == _FREE and allocated_at[slot] >= i)):
                break
            j += 1
        if j > end > i:
            run = code[i:end + 1]
            sizes = tuple(size for op, size, _ in run if op in (_ALLOC, _TRANSIENT))
            need = sum(((size + 511) & ~511) + SMALL_SIZE for size in sizes)
            out.append((_GROUP, need << _SIZE_SHIFT, (len(run), sizes, (None,) * len(sizes), (False,) * len(sizes),
                                                      _held_above(run))))
            out += run
            i = end + 1
        else:
            out.append(code[i])
            i += 1
    return out


class CardBlocks:
    """A learned model card's per-block requests (core/card.py), replayed in place of the
    hand-written blocks: each phase's allocations and frees in the card's order, sized at the
    layout's micro-batch and sequence length. The card records sizes, not tensors, so a free
    goes to a live tensor of its size: one the phase made (the latest, unless the card names another
    or names one made before it: `pairs`), else one made before it (what the block's forward left for
    its backward, the block's input, the incoming gradient).
    In backward, a constant-size allocation the size of one of the model's weights is that
    weight's gradient: the card's free of it (the learner drops each gradient after its
    AccumulateGrad) becomes DeepSpeed's hook. Requests of 1 MiB or less stay in the small pool
    (not replayed), small gradients are counted into the buckets as the hand model's norms.
    With checkpointing the card's checkpointed backward holds the recompute: `recompute` makes
    nothing. Unmatched frees (of a tensor the step made outside the block) are counted, not
    replayed."""

    def __init__(self, card, s: _Seq, layers: int, micro_batch: int, seq: int, checkpointing: bool,
                 hf_norm: bool, first_matmul, device: Device, leaf: tuple[int, ...] = ()) -> None:
        self.device = device  # the GPU a reduction kernel's scratch is sized for (core.reductions)
        self.leaf = leaf  # ZeRO-3's leaf MoE block's gradients (bytes, parameter order): LeafGradients
        self.regime = card.regime(seq, micro_batch)
        self.kinds = card.layer_kinds
        self.s, self.layers, self.ckpt, self.hf_norm = s, layers, checkpointing, hf_norm
        self.micro_batch, self.seq = micro_batch, seq
        self.first_matmul = first_matmul
        self.forward_matmul_made = False  # the forward thread's cuBLAS workspace (`first_projection`)
        self.grad_sizes = frozenset(2 * n for n in card.parameter_numels)
        self.compiled: dict[tuple[int, str], list[tuple[int, bool]]] = {}
        self.op_requests: dict[tuple[int | None, str], list[int]] = {}  # each op's index in the card's phase
        self.rebound: dict[tuple[int | None, str], frozenset[int]] = {}  # `rebinds`, once per phase
        self.paired: dict[tuple[int | None, str], dict[int, int]] = {}  # `pairs`, once per phase
        self.programs: dict[tuple[int, str], tuple] = {}
        self.layer = 0
        self.backward_layer = 0  # counts down: the block whose backward comes next is this one - 1
        self.freed_inputs: set[int] = set()  # block inputs the card's requests freed
        self.saved_by_input: dict[int, dict] = {}  # checkpointing: the forward's leftovers per input
        self.carried: list[int] = []  # a backward's leftovers, freed by the next block's requests
        self.previous: dict | None = None  # the forward's last block: its leftovers, for the next one's frees
        self.unmatched = 0
        self.head_unmatched = 0  # the same, in the head's and loss's phases (masks made before the blocks)
        self.held: int | None = None  # the head's forward: the outputs the loop keeps (`run`'s hold)

    def makes_leaf_gradients(self, kind: int, phase: str) -> bool:
        """Whether this kind of block's backward makes every gradient of a leaf MoE block (`leaf`)."""
        made = [size for size, grad in self.ops(kind, phase) if grad and size > 0]
        return all(made.count(size) >= self.leaf.count(size) for size in self.leaf)

    def card_phase(self, kind: int | None, phase: str):
        """The card's phase for a block of this kind, or with `kind` None the head's (`Regime.head_*`)."""
        if kind is None:
            return getattr(self.regime, f"head_{phase}")
        return getattr(self.regime.block(kind), phase)

    def ops(self, kind: int | None, phase: str) -> list[tuple[int, bool]]:
        """(signed size, whether it allocates or frees a weight's gradient) per request of a block's
        phase, or with `kind` None of the head's and loss's (`Regime.head_*`)."""
        key = (kind, phase)
        if key not in self.compiled:
            card_phase = self.card_phase(kind, phase)
            requests = card_phase.requests
            # a reduction kernel's scratch (sized for the GPU) is never a weight's gradient
            scratch = {at + i for at, _ in card_phase.reductions for i in range(REDUCTION_EVENTS)}
            backward = "backward" in phase
            ops, at = [], []
            for index, ((q, a, _), size) in enumerate(zip(requests, card_phase.sizes(self.micro_batch, self.seq,
                                                                                     self.device))):
                grad_sized = backward and abs(size) in self.grad_sizes and index not in scratch
                # a small-pool request touches nothing replayed, unless it is a (norm's) gradient
                if abs(size) > SMALL_SIZE or grad_sized:
                    # a weight's gradient is as large whatever the tokens: a request that grows
                    # with them is an activation's, even where its size happens to match
                    ops.append((size, grad_sized and q == 0 and a == 0))
                    at.append(index)
            self.compiled[key] = ops
            self.op_requests[key] = at
        return self.compiled[key]

    def pairs(self, kind: int | None, phase: str) -> dict[int, int]:
        """The phase's frees (indices into `ops`) that take a named earlier tensor of the phase, not
        the latest live one of their size (`Phase.frees`, recorded by the learner where the two differ):
        {free: the allocation it takes, or FREED_OUTSIDE for one made before the phase (`free_outside`)}."""
        key = (kind, phase)
        if key not in self.paired:
            self.ops(kind, phase)
            card_phase = self.card_phase(kind, phase)
            op_of = {request: i for i, request in enumerate(self.op_requests[key])}
            self.paired[key] = {op_of[free]: FREED_OUTSIDE if made == FREED_OUTSIDE else op_of[made]
                                for free, made in card_phase.frees
                                if free in op_of and (made in op_of or made == FREED_OUTSIDE)}
        return self.paired[key]

    def rebinds(self, kind: int | None, phase: str) -> frozenset[int]:
        """The head's forward frees (indices into `ops`) that take the tensor made before the
        one just made: the card's previous request allocated a tensor of the freed size, nothing
        in between. That is `x = op(x)` over an op that saves nothing of its input: Python drops
        the old `x` as the new one is bound. Gemma-2's final logit softcapping (transformers
        models/gemma2/modeling_gemma2.py: `logits / cap`, `torch.tanh`, `* cap`, each rebinding
        `logits`; derivatives.yaml: div.Scalar and mul.Scalar save no tensor, tanh its result)
        frees the lm_head's output as the division's is made, then the division's as tanh's is;
        tanh's output lives to the backward. The latest tensor of the size (the rule elsewhere)
        would free each output as it is made and keep the lm_head's. Gemma-2-2B L10 ZeRO-2
        trace (h200-2026-12-13 trace-4): 2000 MiB each, +L1 +L2 -L1 +L3 -L2 +L4. Granite's
        `logits = logits / logits_scaling` (modeling_granite.py, modeling_granitemoe.py) is one
        such rebinding. A free after
        other requests (a norm's `x.pow(2)` freed once `mean` has made its output) keeps the
        latest. The head's forward only: over the blocks' forward too, the same batch's Falcon-7B
        trace (trace-2) would replay 104.83 GiB against the run's 99.76 (96.91 without), a
        block's ops being less often rebindings than the head's softcapping."""
        key = (kind, phase)
        if key not in self.rebound:
            ops, at = self.ops(kind, phase), self.op_requests.get(key)
            self.rebound[key] = frozenset() if kind is not None or "forward" not in phase else frozenset(
                i for i in range(1, len(ops)) if ops[i][0] < 0 and ops[i - 1][0] == -ops[i][0]
                and not ops[i - 1][1] and at[i - 1] == at[i] - 1)
        return self.rebound[key]

    def first_projection(self, kind: int, phase: str, block_input: int) -> int:
        """How many of a block's forward ops (`ops`) come before its first matmul, which takes the
        forward thread's cuBLAS workspace (Replay.first_matmul): torch allocates a matmul's output,
        then asks for the thread's cuBLAS handle, whose first use allocates the workspace
        (aten/src/ATen/native/cuda/Blas.cpp addmm_out_cuda_impl -> at::cuda::blas::gemm ->
        getCurrentCUDABlasHandle, CublasHandlePool.cpp: cublasSetWorkspace(getCUDABlasWorkspace())).
        A decoder block opens with its input norm, whose tensors of the hidden state's size
        HandBlocks.norm_forward writes (transformers' RMSNorm: five, its fp32 copy, pow, product,
        cast and output; a LayerNorm: its output), then its attention's first projection: the
        workspace follows that projection's output, the next such tensor (Qwen3-8B-L6 ZeRO-3
        trace, h200-2026-12-12: 128 128 -128 128 64 64 -128, q_proj's 64 MiB output, then the
        32 MiB workspace, never freed). Counted over the card's own requests at this shape
        (`block_input`: the block's input, the hidden state in bf16), small ones included; a
        card with fewer such tensors takes it before its first request, as before."""
        norm = 5 if self.hf_norm else 1
        self.ops(kind, phase)  # each op's request: `op_requests`
        card_phase = self.card_phase(kind, phase)
        hidden = [i for i, size in enumerate(card_phase.sizes(self.micro_batch, self.seq, self.device))
                  if 2 * size >= block_input]
        if len(hidden) <= norm:
            return 0
        return bisect_right(self.op_requests[(kind, phase)], hidden[norm])

    def program(self, kind: int | None, phase: str) -> tuple[list[tuple[int, int, int]], int, list]:
        """A phase's requests for `run_program`: `run`'s matching of frees to tensors, which
        depends only on the phase's own requests where no `made`, `hold`, `first_grad` or
        `hook_left` is given (a block's phases), worked out once per phase rather than once per
        block per step. Returns the instructions (opcode, size, slot: the phase's tensors are
        numbered in the order made), the number of slots, and the live tensors at the end
        (size, slots). A replayed allocation that the next request frees again is a transient
        (`_Seq.transient`: no block of its own, the pools end as they began): a third of a
        card's allocations."""
        key = (kind, phase)
        if key not in self.programs:
            ops = self.ops(kind, phase)
            paired = self.pairs(kind, phase)
            code: list[tuple[int, int, int]] = []
            own: dict[int, list[int]] = {}
            grads: dict[int, list[int]] = {}
            slot_of: dict[int, int] = {}  # an own tensor's op -> its slot (`pairs`)
            slots = i = 0
            while i < len(ops):
                size, grad = ops[i]
                i += 1
                if size > 0:
                    if size > SMALL_SIZE and not grad and i < len(ops) and ops[i] == (-size, False) \
                            and paired.get(i, i - 1) == i - 1:
                        code.append((_TRANSIENT, size, 0))
                        i += 1
                        continue
                    (grads if grad else own).setdefault(size, []).append(slots)
                    if not grad:
                        slot_of[i - 1] = slots
                    if size > SMALL_SIZE:  # a small-pool tensor's slot stays None
                        code.append((_ALLOC, size, slots))
                    slots += 1
                    continue
                size = -size
                if not grad and paired.get(i - 1) == FREED_OUTSIDE:  # made before the phase, though one of its own lives
                    if size > SMALL_SIZE:
                        code.append((_OUTSIDE, size, 0))
                    continue
                named = slot_of.get(paired.get(i - 1)) if not grad else None
                if named is not None and named in own.get(size, ()):
                    own[size].remove(named)
                    if size > SMALL_SIZE:
                        code.append((_FREE, size, named))
                elif grad and grads.get(size):
                    code.append(_hook_op(size, grads[size].pop(0)))
                elif own.get(size):
                    slot = own[size].pop()
                    if size > SMALL_SIZE:
                        code.append((_FREE, size, slot))
                elif size > SMALL_SIZE:
                    code.append((_OUTSIDE, size, 0))
            code += [_hook_op(size, slot) for size, left in grads.items() for slot in left]  # at its end
            live = [(size, left if size > SMALL_SIZE else []) for size, left in own.items()]
            self.programs[key] = (_closed_groups(code), slots, live)
        return self.programs[key]

    def run_program(self, kind: int | None, outside: list[int], hook, code: list[tuple[int, int, int]],
                    slots: int, live: list) -> dict[int, list[int]]:
        """`run` for a phase's `program`, on a live sequence (planning): the same requests, frees
        and hooks in the same order, with `_Seq.a`, `f` and `transient` written out on the
        default stream's pool (the card's blocks make most of a carded plan's requests: a tenth
        of its replay was those calls). A run that leaves the pool as it found it is skipped
        (`_closed_groups`: a fifth of a carded plan's replay)."""
        s = self.s
        sizes, blocks, held = s.sizes, s.blocks, s.held
        add_size, add_block, add_held = sizes.append, blocks.append, held.append
        pool = s.pools[DEFAULT_STREAM]
        malloc, transient, free_index = pool.malloc, pool.transient, pool.free_index
        names: list = [None] * slots
        self.held = None
        instructions = iter(code)
        for op, size, slot in instructions:
            if op == _GROUP:
                if free_index and free_index[-1] >= size:  # a free block holds the run: skipped
                    length, made, nones, falses, above = slot
                    sizes += made
                    blocks += nones
                    held += falses
                    if s.allocated + above > s.peak_allocated:
                        s.peak_allocated = s.allocated + above
                    next(islice(instructions, length, length), None)
            elif op == _ALLOC:
                names[slot] = len(sizes)
                add_size(size)
                add_block(malloc(size))
                add_held(True)
                s.allocated += size
                if s.allocated > s.peak_allocated:
                    s.peak_allocated = s.allocated
            elif op == _FREE:
                name = names[slot]
                if held[name]:
                    held[name] = False
                    s.allocated -= sizes[name]
                block = blocks[name]
                if block is not None:
                    blocks[name] = None  # forgotten once freed, as `_Seq.f` does
                    block.pool.free(block)
            elif op == _TRANSIENT:
                add_size(size)
                add_block(None)
                add_held(False)
                if s.allocated + size > s.peak_allocated:
                    s.peak_allocated = s.allocated + size
                transient(size)
            elif op == _HOOK:
                hook([names[slot]])
            elif op == _HOOK_SMALL:
                hook([], size // 2)
            else:  # _OUTSIDE
                self.free_outside(kind, outside, size)
        return {size: [names[slot] for slot in left] for size, left in live}

    def free_outside(self, kind: int | None, outside: list[int], size: int) -> None:
        """A free of a tensor made before the phase: the latest live one of its size in
        `outside` (taken out of it), else counted as unmatched."""
        for j in range(len(outside) - 1, -1, -1):
            if self.s.sizes[outside[j]] == size:
                self.s.f(outside.pop(j))
                return
        if kind is None:
            self.head_unmatched += 1
        else:
            self.unmatched += 1

    def run(self, kind: int | None, phase: str, outside: list[int], hook=None, *, made: tuple[int, ...] = (),
            hold: int = 0, first_grad=None, hook_left: bool = True, matmul_at: int = -1,
            made_first: bool = False, input_grad_first: bool = False) -> dict[int, list[int]]:
        """Replay one phase; `outside`: live tensors made before it that its frees may take
        (tried last first; taken ones are removed). Returns the phase's live tensors by size.
        For the head's phases: `made`, sizes whose first free the replay has made already (the
        last block's input, freed in the card's block window); `hold`, a size whose last free
        is not made (the loop's outputs): the tensor is left in `self.held`; `first_grad`, called
        once the first weight gradient is allocated (autograd's thread's first matmul: its output,
        then the workspace; h200-2026-12-19 traces); `hook_left` False: a gradient the phase never drops (a tied weight's, summed later) is
        returned among the live tensors, not hooked. For a block's forward: `matmul_at`, the op
        before which the forward thread's first matmul takes its cuBLAS workspace
        (`first_projection`). `made_first`: the phase's first request was made by the caller (the
        preamble's embedding output, before ZeRO-3 releases the embedding's weight).
        `input_grad_first`: the first weight gradient's matmul is ZeRO-3's
        LinearFunctionForZeroStage3 backward (deepspeed/runtime/zero/linear.py), which makes the
        input's gradient before the weight's, where torch's linear (the card's recording) makes
        the weight's first: the allocation the card lists after that gradient is made before it,
        then `first_grad` (the matmul's output, then the thread's cuBLAS workspace), then the
        gradient (gemma-2-2b ZeRO-3 five-step trace, h200-2026-12-31d: +9 +32 +1125 MiB)."""
        s = self.s
        own: dict[int, list[int]] = {}
        grads: dict[int, list[int | None]] = {}
        made = list(made)
        # a phase with rebinding frees runs here: its program would free each tensor as the next is
        # made (a transient), where `rebinds` frees the one before
        rebinds = self.rebinds(kind, phase)
        if s.live and DEFAULT_STREAM in s.pools and not (
                made or hold or first_grad is not None or not hook_left or matmul_at >= 0 or rebinds or made_first):
            return self.run_program(kind, outside, hook, *self.program(kind, phase))
        ops = self.ops(kind, phase)[1:] if made_first else self.ops(kind, phase)
        shift = 1 if made_first else 0
        paired = {free - shift: made if made == FREED_OUTSIDE else made - shift
                  for free, made in self.pairs(kind, phase).items() if made >= shift or made == FREED_OUTSIDE}
        name_of: dict[int, int | None] = {}  # an own tensor's op -> its name (`pairs`)
        held_at = max((i for i, (size, _) in enumerate(ops) if size == -hold), default=-1) if hold else -1
        self.held = None
        ahead = -1  # an allocation made ahead of the first weight gradient (`input_grad_first`)
        for i, (size, grad) in enumerate(ops):
            if i == matmul_at:
                self.first_matmul("forward")
            if i == ahead:
                continue
            if size > 0:
                if grad and first_grad is not None and input_grad_first and i + 1 < len(ops) \
                        and ops[i + 1][0] > 0 and not ops[i + 1][1]:
                    ahead = i + 1
                    made_ahead = s.a(ops[ahead][0]) if ops[ahead][0] > SMALL_SIZE else None
                    own.setdefault(ops[ahead][0], []).append(made_ahead)
                    name_of[ahead] = made_ahead
                    first_grad()
                    first_grad = None
                name = s.a(size) if size > SMALL_SIZE else None
                if grad and first_grad is not None:
                    first_grad()
                    first_grad = None
                (grads if grad else own).setdefault(size, []).append(name)
                if not grad:
                    name_of[i] = name
                continue
            size = -size
            if not grad and i in paired and paired[i] in name_of and name_of[paired[i]] in own.get(size, ()):
                named = name_of.pop(paired[i])
                own[size].remove(named)
                if i == held_at:  # kept, not freed: the tensor this free drops, not the latest of its
                    self.held = named  # size (CPM-Ant's logits beside CrossEntropyLoss's bf16 log_softmax)
                elif named is not None:
                    s.f(named)
            elif i == held_at and own.get(size):
                self.held = own[size].pop()
            elif not grad and paired.get(i) == FREED_OUTSIDE and size not in made:
                if size > SMALL_SIZE:  # made before the phase, though one of its own lives
                    self.free_outside(kind, outside, size)
            elif grad and grads.get(size):
                name = grads[size].pop(0)
                if name is None:
                    hook([], size // 2)
                else:
                    hook([name])
            elif size in made:
                made.remove(size)
            elif own.get(size):
                s.f(own[size].pop(-2 if rebinds and i in rebinds and len(own[size]) > 1 else -1))
            elif size <= SMALL_SIZE:
                pass  # a small-pool tensor made outside the phase
            else:
                self.free_outside(kind, outside, size)
        if matmul_at >= len(ops):
            self.first_matmul("forward")
        for size, names in grads.items():  # gradients the phase never dropped: hooked at its end
            for name in names:
                if not hook_left:
                    if name is not None:
                        own.setdefault(size, []).append(name)
                elif name is None:
                    hook([], size // 2)
                else:
                    hook([name])
        return {size: [n for n in names if n is not None] for size, names in own.items()}

    @staticmethod
    def latest(live: dict[int, list[int]], size: int) -> int | None:
        names = live.get(size)
        return names.pop() if names else None

    def run_after_block(self, kind: int | None, phase: str, outside: list[int], offer: bool = True,
                        **kwargs) -> dict[int, list[int]]:
        """`run` a phase that follows a block's forward (the next block's, the head's): with `offer`,
        that block's leftovers are offered to its frees too, after `outside` (a block that returns a
        tensor beside its output, MPT's attention weights, keeps it until the model's loop drops
        that tuple, in the next window; checkpointed, nothing else holds it: h200-2026-12-29, MPT-7B's
        1 GiB a block, kept to the backward, was 8.4 GiB over at 8 blocks). What the frees took is
        removed from `outside` and from that block's saved tensors."""
        before = list(self.previous["saved"]) if offer and self.previous is not None else []
        offered = [*before, *outside]
        live = self.run(kind, phase, offered, **kwargs)
        if before:
            self.previous["saved"] = [n for n in before if n in offered]
        outside[:] = [n for n in outside if n in offered]
        return live

    def forward(self, x: int, first: bool) -> tuple[dict, int | None]:
        # a model with more layers than its card lists (break-even's deeper variants) repeats
        # the last kind: a MoE model's dense blocks come first
        kind = self.kinds[min(self.layer, len(self.kinds) - 1)]
        self.layer = (self.layer + 1) % self.layers
        phase = "checkpointed_forward" if self.ckpt else "forward"
        matmul_at = -1
        if not self.forward_matmul_made:  # the forward's first matmul is this block's
            self.forward_matmul_made = True
            matmul_at = self.first_projection(kind, phase, self.s.sizes[x])
        # the first block's input is the model's `inputs_embeds`, which the model's forward frees
        outside = [] if first else [x]
        live = self.run_after_block(kind, phase, outside, offer=not first, matmul_at=matmul_at)
        if not first and not outside:
            self.freed_inputs.add(x)
        out = self.latest(live, self.s.sizes[x])
        if out is None:  # an output of another size than the input: the phase's last tensor
            everything = sorted(n for names in live.values() for n in names)
            out = everything.pop() if everything else self.s.a(self.s.sizes[x])
            for names in live.values():
                if out in names:
                    names.remove(out)
        # the block's input, for its backward's frees: alive unless freed here, or (the first
        # block's, with transformers' RMSNorm and no checkpoint) freed by the step before backward
        keeps_input = (outside or first) and not (first and not self.ckpt and self.hf_norm)
        sv = {"kind": kind, "saved": sorted(n for names in live.values() for n in names),
              "input": x if keeps_input else None}
        if self.ckpt:
            self.saved_by_input[x] = sv
        self.previous = sv
        return sv, out

    def recompute(self, x: int) -> dict:
        return self.saved_by_input.pop(x)

    def backward(self, sv: dict, g: int, hook) -> int:
        size_g = self.s.sizes[g]
        outside = [g, *([sv["input"]] if sv["input"] is not None else []), *self.carried, *sv["saved"]]
        self.carried = []
        phase = "checkpointed_backward" if self.ckpt else "backward"
        leaf = None
        if self.leaf and self.makes_leaf_gradients(sv["kind"], phase):
            hook = leaf = LeafGradients(self.s, 2, self.leaf, hook)  # a MoE block's backward
        live = self.run(sv["kind"], phase, outside, hook)
        if leaf is not None:
            leaf.release()  # what the card kept past the block's end
        if sv["input"] is not None and (self.ckpt or sv["input"] not in outside):
            # with checkpointing the card frees the checkpoint's input itself, in this block's
            # window or the next one's (it dies once autograd has let go of the recompute)
            self.freed_inputs.add(sv["input"])
        gin = self.latest(live, size_g)
        if gin is None:
            if g in outside:
                outside.remove(g)
                gin = g
            else:
                everything = sorted(n for names in live.values() for n in names)
                gin = everything.pop() if everything else self.s.a(size_g)
                for names in live.values():
                    if gin in names:
                        names.remove(gin)
        # what is left (the forward's saved tensors the card frees in the next block's window,
        # the incoming gradient when a new one was made) goes to the next block's frees
        self.carried = [n for n in outside if self.ckpt or n != sv["input"]] + sorted(
            n for names in live.values() for n in names)
        self.backward_layer = (self.backward_layer - 1) % self.layers
        if self.backward_layer == 0:
            # the micro-step's last block: what no later window frees dies with the backward
            self.s.f(*self.carried)
            self.carried = []
        return gin

