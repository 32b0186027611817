"""The CPU recipe's second round of levers: mimetic attention init, fixed sin-cos position
embeddings, Muon, annealed patch dropout, alternating flips; and repeated augmentation
(test-time augmentation is in test_tta.py)."""

import itertools
import math

import pytest
import timm
import torch

import vit
import vit.training.optimizers
from vit.data.batch_pipeline import InMemoryBatches
from vit.data.datasets import ImageDataset
from vit.data.mixup import MixupCutmix, one_hot
from vit.data.repeated_augmentation import RepeatAugSampler
from vit.data.transforms import AugmentConfig, train_transform
from vit.models.initializers import (
    mimetic_init_,
    patch_moments,
    sincos_2d,
    sincos_pos_embed_,
    whiten_patch_embed_,
)
from vit.training.optimizers import (
    Muon,
    build_optimizer,
    muon_param_groups,
    orthogonalize,
    orthogonalize_all,
    share_work,
)
from vit.training.settings import (
    TrainConfig,
    mixup_on_for_epoch,
    patch_drop_for_epoch,
    resolve_optimizer,
)

SMALL = {"embed_dim": 64, "depth": 2, "num_heads": 4, "num_classes": 10}


def small_model(**kwargs) -> vit.VisionTransformer:
    return vit.create_model("vit_cifar_patch4_32", **{**SMALL, **kwargs})


# -- mimetic initialisation ------------------------------------------------------------------------
def test_mimetic_init_gives_each_head_an_identity_like_query_key_product():
    torch.manual_seed(0)
    model = mimetic_init_(small_model())
    attn, dim, head_dim = model.blocks[0].attn, 64, 16
    w_q, w_k, w_v = attn.qkv.weight.detach().view(3, dim, dim)
    for h in range(4):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        product = w_q[rows].T @ w_k[rows]  # (D, D): the head's bilinear attention score
        assert torch.linalg.matrix_rank(product) == head_dim
        off_diagonal = product - torch.diag(product.diag())
        assert product.diag().mean() > 3 * off_diagonal.std()  # tokens attend to their like
    # values and output projection: full rank, exactly alpha * Z - beta * I for some Z
    product = w_v.T @ attn.proj.weight.detach().T  # (D, D)
    assert product.diag().mean() == pytest.approx(-0.4, abs=0.05)
    noise = product + 0.4 * torch.eye(dim)
    assert noise.std() * math.sqrt(dim) == pytest.approx(0.4, rel=0.15)  # alpha * N(0, 1/D)


def test_mimetic_init_makes_attention_at_initialisation_more_peaked():
    """A random init spreads attention almost uniformly; mimetic heads start focused."""

    def mean_entropy(model):
        captured = []
        model.set_fused_attn(False)
        hook = model.blocks[0].attn.softmax.register_forward_hook(
            lambda m, i, out: captured.append(out)
        )
        model.eval()(torch.randn(8, 3, 32, 32))
        hook.remove()
        p = captured[0]  # (B, nh, N, N)
        return -(p * p.clamp_min(1e-12).log()).sum(-1).mean().item()

    torch.manual_seed(0)
    plain = small_model()
    torch.manual_seed(0)
    mimetic = mimetic_init_(small_model())
    uniform = math.log(65)
    assert mean_entropy(plain) > 0.99 * uniform
    assert mean_entropy(mimetic) < 0.9 * uniform


def test_mimetic_model_still_loads_into_timm_with_the_same_outputs():
    torch.manual_seed(0)
    ours = mimetic_init_(small_model()).eval()
    theirs = timm.create_model(
        "vit_base_patch16_224", img_size=32, patch_size=4, mlp_ratio=2.0, **SMALL
    ).eval()
    theirs.load_state_dict(ours.state_dict())
    torch.nn.init.normal_(ours.head.weight), theirs.head.weight.data.copy_(ours.head.weight)
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ours(images), theirs(images), rtol=1e-5, atol=1e-6)


# -- fixed sin-cos position embeddings -------------------------------------------------------------
def test_sincos_position_embeddings_are_fixed_and_encode_row_and_column():
    model = sincos_pos_embed_(small_model())
    pos = model.pos_embed[0]  # (1 + 64, D)
    assert not model.pos_embed.requires_grad
    assert torch.equal(pos[0], torch.zeros(64))  # the class token has no position
    grid = pos[1:].view(8, 8, 64)
    # a quarter of the channels: sin and cos of the row, the same in every column
    assert torch.equal(grid[3, 0, :32], grid[3, 7, :32])
    assert torch.equal(grid[0, 5, 32:], grid[6, 5, 32:])
    torch.testing.assert_close(grid[2, 5, 0], torch.tensor(math.sin(2.0)))  # frequency 1
    torch.testing.assert_close(grid[2, 5, 48], torch.tensor(math.cos(5.0)))
    assert torch.equal(sincos_2d((8, 8), 64), pos[1:])
    optimizer = build_optimizer(model, "adamw", lr=1e-3, weight_decay=0.05)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert id(model.pos_embed) not in trained


def test_sincos_needs_a_width_divisible_by_four():
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d((8, 8), 30)


# -- whitened patch embedding ----------------------------------------------------------------------
def smooth_images(count: int, seed: int = 0) -> torch.Tensor:
    """Images (N, 3, 32, 32) whose neighbouring pixels and channels are strongly correlated, as
    photographs' are: noise at 8x8, mostly shared by the channels, upsampled, and a little noise
    of their own."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(count, 3, 8, 8, generator=generator)
    coarse = coarse.mean(1, keepdim=True) + 0.3 * coarse  # (N, 3, 8, 8)
    images = torch.nn.functional.interpolate(coarse, size=32, mode="bilinear")
    return images + 0.05 * torch.randn(count, 3, 32, 32, generator=generator)


def token_moments(model: vit.VisionTransformer, images: torch.Tensor) -> tuple:
    with torch.no_grad():
        tokens = model.patch_embed(images).flatten(0, 1).double()  # (N*L, D)
    return tokens.mean(0), torch.cov(tokens.T)  # (D,), (D, D)


def test_patch_moments_are_the_patches_own_batch_by_batch():
    images = smooth_images(12)
    patches = torch.nn.functional.unfold(images.double(), kernel_size=4, stride=4)  # (N, 48, 64)
    patches = patches.transpose(1, 2).reshape(-1, 48)  # (N*64, 48): as the conv's weight, (C, p, p)
    assert torch.equal(patches[1], images[0, :, 0:4, 4:8].reshape(48).double())
    mean, cov = patch_moments(images.split(5), (4, 4))  # batches of 5, 5 and 2
    torch.testing.assert_close(mean, patches.mean(0))
    torch.testing.assert_close(cov, torch.cov(patches.T, correction=0))
    with pytest.raises(ValueError, match="no images"):
        patch_moments([], (4, 4))


@pytest.mark.parametrize("embed_dim", [64, 32])  # more channels than a patch's 48 values, fewer
def test_whitened_patch_embedding_makes_the_tokens_white_at_the_default_size(embed_dim):
    torch.manual_seed(0)
    images = smooth_images(64)
    plain = small_model(embed_dim=embed_dim)
    plain_mean, plain_cov = token_moments(plain, images)
    whitened = whiten_patch_embed_(small_model(embed_dim=embed_dim), images.split(16), eps=1e-9)
    mean, cov = token_moments(whitened, images)
    spectrum = torch.linalg.eigvalsh(cov).flip(0)
    before = torch.linalg.eigvalsh(plain_cov).flip(0)
    kept = min(embed_dim, 48)
    assert before[0] > 100 * before[kept - 1]  # a few loud directions, many quiet ones
    # whitened: the kept directions equally loud, none besides them, the tokens centred
    torch.testing.assert_close(
        spectrum[:kept], spectrum[:kept].mean().expand(kept), rtol=1e-4, atol=0
    )
    assert all(spectrum[kept:].abs() < 1e-5 * spectrum[0])  # (none where D <= 48)
    assert mean.abs().max() < 1e-6 and plain_mean.abs().max() > 1e-3
    # the tokens' expected squared size is the default initialisation's, D * 0.02^2 * trace
    _, patch_cov = patch_moments([images], (4, 4))
    size = (mean.square().sum() + cov.trace() * (len(images) * 64 - 1) / (len(images) * 64)).item()
    assert size == pytest.approx(embed_dim * 0.02**2 * patch_cov.trace().item(), rel=1e-6)
    assert plain.patch_embed.proj.weight.std().item() == pytest.approx(0.02, rel=0.1)  # its std


def test_whitening_damps_the_directions_quieter_than_eps():
    torch.manual_seed(0)
    images = smooth_images(64)
    _, patch_cov = patch_moments([images], (4, 4))
    values = torch.linalg.eigvalsh(patch_cov).flip(0)  # (48,)
    eps = values[10].item()  # the 11th loudest direction
    model = whiten_patch_embed_(small_model(), [images], eps=eps)
    _, cov = token_moments(model, images)
    spectrum = torch.linalg.eigvalsh(cov).flip(0)[:48]
    # each direction keeps values / (values + eps) of the loudest one's scale
    share = values / (values + eps)
    torch.testing.assert_close(spectrum / spectrum[0], share / share[0], rtol=1e-3, atol=1e-7)


# -- Muon -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(64, 64), (64, 192), (256, 64)])
def test_orthogonalize_brings_every_singular_value_near_one(shape):
    """Singular values spread over 1.5 decades all land in about [0.7, 1.2] (five quintic
    Newton-Schulz steps; much smaller ones, below ~1/500 of the norm, would not)."""
    torch.manual_seed(0)
    rank = min(shape)
    u = torch.linalg.qr(torch.randn(shape[0], rank)).Q  # (m, r) orthonormal columns
    v = torch.linalg.qr(torch.randn(shape[1], rank)).Q  # (n, r)
    matrix = u @ torch.diag(7 * torch.logspace(-1.5, 0, rank)) @ v.T  # sigma 0.22 .. 7
    singular = torch.linalg.svdvals(orthogonalize(matrix))
    assert singular.min() > 0.6 and singular.max() < 1.25


def newton_schulz_by_hand(matrix: torch.Tensor) -> torch.Tensor:
    """Keller Jordan's Muon iteration, written out independently in float64: the published
    quintic coefficients (3.4445, -4.7750, 2.0315), five steps, on the wide orientation."""
    x = matrix.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm()  # Frobenius
    for _ in range(5):
        gram = x @ x.T
        x = 3.4445 * x + (-4.7750 * gram + 2.0315 * gram @ gram) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(32, 64), (64, 32), (48, 48)])
def test_orthogonalize_is_five_quintic_newton_schulz_steps_with_jordans_coefficients(shape):
    """The singular-value band above accepts other iterations (4 steps, other coefficients
    are 25-40% away from this one); the recipes' results depend on this exact one."""
    matrix = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    expected = newton_schulz_by_hand(matrix)
    ours = orthogonalize(matrix)
    assert ours.dtype == torch.float32
    assert (ours.double() - expected).abs().max() < 1e-5 * expected.abs().max()


def test_orthogonalize_all_batches_same_shapes_bit_identically_in_float32_and_near_in_bf16():
    torch.manual_seed(0)
    shapes = [(32, 32), (64, 32), (32, 32), (32, 64), (64, 32), (32, 32)]
    matrices = [torch.randn(shape) for shape in shapes]
    alone = [orthogonalize(m) for m in matrices]
    batched = orthogonalize_all(matrices, steps=5, dtype=torch.float32)
    assert [r.shape for r in batched] == [torch.Size(s) for s in shapes]  # in the given order
    for one, many in zip(alone, batched, strict=True):
        assert torch.equal(one, many)
    for one, half in zip(alone, orthogonalize_all(matrices, 5, torch.bfloat16), strict=True):
        assert half.dtype == torch.float32
        assert (half - one).norm() < 0.05 * one.norm()  # bf16's ~3 digits over 5 steps: ~3%
        assert torch.allclose(torch.linalg.svdvals(half), torch.linalg.svdvals(one), atol=0.05)


def test_muon_step_matches_pytorchs_muon_up_to_its_bfloat16():
    """Our float32 Newton-Schulz and PyTorch's bfloat16 one give the same update, to bf16.

    The updates are compared, not the weights: 3 steps move N(0, 1) weights by ~0.04 at most,
    less than a tolerance on the weights would allow (a Muon that only decayed passed that)."""
    torch.manual_seed(0)
    start = torch.randn(96, 64)
    ours_w = torch.nn.Parameter(start.clone())
    theirs_w = torch.nn.Parameter(start.clone())
    ours = Muon([{"params": [ours_w], "use_muon": True}], lr=0.02, weight_decay=0.1)
    theirs = torch.optim.Muon([theirs_w], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        grad = torch.randn(96, 64)
        ours_w.grad, theirs_w.grad = grad.clone(), grad.clone()
        ours.step(), theirs.step()
    ours_update, theirs_update = ours_w.detach() - start, theirs_w.detach() - start
    assert (ours_update - theirs_update).norm() < 3e-2 * theirs_update.norm()  # measured 0.9%


def test_muon_splits_fused_qkv_and_leaves_embeddings_norms_and_head_to_adamw():
    model = small_model()
    groups = muon_param_groups(model, weight_decay=0.05, muon_lr=0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    by_kind = {}
    for group in groups:
        key = (group.get("use_muon", False), group.get("splits", 1))
        by_kind.setdefault(key, []).extend(names[id(p)] for p in group["params"])
    assert sorted(by_kind[(True, 3)]) == ["blocks.0.attn.qkv.weight", "blocks.1.attn.qkv.weight"]
    assert "blocks.0.mlp.fc1.weight" in by_kind[(True, 1)]
    assert "blocks.1.attn.proj.weight" in by_kind[(True, 1)]
    adamw = by_kind[(False, 1)]
    for name in ("patch_embed.proj.weight", "pos_embed", "cls_token", "head.weight", "norm.bias"):
        assert name in adamw
    assert sum(len(v) for v in by_kind.values()) == len(list(model.parameters()))
    qkv = next(g for g in groups if g.get("splits") == 3)
    assert qkv["lr"] == 0.01 and qkv["weight_decay"] == 0.05


def test_muon_orthogonalises_query_key_and_value_separately():
    """q's gradient is 10^6 times smaller than v's: orthogonalised together, q would hardly
    move; split, each of q, k and v gets an update of the same size."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.zeros(3 * 16, 32))
    optimizer = Muon([{"params": [weight], "use_muon": True, "splits": 3}], lr=1.0)
    scales = torch.tensor([1e-3, 1.0, 1e3]).repeat_interleave(16)[:, None]
    weight.grad = torch.randn(48, 32) * scales
    optimizer.step()
    sizes = weight.detach().view(3, 16, 32).norm(dim=(1, 2))  # (3,): q, k, v
    assert sizes.max() / sizes.min() < 1.2
    together = orthogonalize(weight.grad).view(3, 16, 32).norm(dim=(1, 2))
    assert together[0] / together[2] < 1e-2  # what splitting avoids


def test_muon_trains_a_small_vit_and_its_state_round_trips():
    torch.manual_seed(0)
    model = small_model().train()
    optimizer = build_optimizer(model, "muon", lr=2e-3, weight_decay=0.0)
    images, labels = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(), loss.backward(), optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]
    again = build_optimizer(small_model(), "muon", lr=2e-3, weight_decay=0.0)
    again.load_state_dict(optimizer.state_dict())
    assert again.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def _per_tensor_muon_step(optimizer: Muon, state: dict) -> None:
    """Muon's step written one tensor at a time (the arithmetic Muon.step does with foreach
    calls), in float32 and without sharing, on its own `state`."""
    for group in optimizer.param_groups:
        beta1, beta2 = group["betas"]
        for param in group["params"]:
            grad, own = param.grad, state.setdefault(param, {})
            param.mul_(1 - group["lr"] * group["weight_decay"])
            if group["use_muon"]:
                buf = own.setdefault("momentum_buffer", torch.zeros_like(param))
                buf.lerp_(grad, 1 - group["momentum"])
                blocks = grad.lerp(buf, group["momentum"]).reshape(
                    group["splits"], -1, grad.shape[1]
                )
                update = torch.stack([orthogonalize(block) for block in blocks])
                scale = 0.2 * math.sqrt(max(update.shape[1], update.shape[2]))
                param.add_(update.reshape(param.shape), alpha=-group["lr"] * scale)
            else:
                own["step"] = own.get("step", 0) + 1
                exp_avg = own.setdefault("exp_avg", torch.zeros_like(param))
                exp_avg_sq = own.setdefault("exp_avg_sq", torch.zeros_like(param))
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (exp_avg_sq / (1 - beta2 ** own["step"])).sqrt_().add_(group["eps"])
                param.addcdiv_(exp_avg, denom, value=-group["lr"] / (1 - beta1 ** own["step"]))


def test_muon_step_equals_its_per_tensor_arithmetic_bit_for_bit():
    """The foreach calls change the speed of a step, not one bit of its result: the recipe's
    runs stay reproducible."""
    models = [small_model(), small_model()]
    models[1].load_state_dict(models[0].state_dict())
    ours = build_optimizer(models[0], "muon", lr=2e-3, weight_decay=0.05)
    reference = build_optimizer(models[1], "muon", lr=2e-3, weight_decay=0.05)
    reference_state = {}
    for step in range(3):
        for model in models:
            generator = torch.Generator().manual_seed(step)
            for param in model.parameters():
                param.grad = torch.randn(param.shape, generator=generator)
        ours.step()
        with torch.no_grad():
            _per_tensor_muon_step(reference, reference_state)
    for (name, mine), theirs in zip(
        models[0].state_dict().items(), models[1].state_dict().values(), strict=True
    ):
        assert torch.equal(mine, theirs), name


def test_muons_adamw_groups_match_torchs_adamw():
    torch.manual_seed(0)
    start = torch.randn(32, 16)
    ours_w = torch.nn.Parameter(start.clone())
    theirs_w = torch.nn.Parameter(start.clone())
    ours = Muon([{"params": [ours_w]}], lr=0.01, weight_decay=0.1, betas=(0.9, 0.99))
    theirs = torch.optim.AdamW([theirs_w], lr=0.01, weight_decay=0.1, betas=(0.9, 0.99))
    for _ in range(5):
        grad = torch.randn(32, 16)
        ours_w.grad, theirs_w.grad = grad.clone(), grad.clone()
        ours.step(), theirs.step()
    assert (theirs_w.detach() - start).abs().mean() > 1e-2  # the steps moved the weights
    torch.testing.assert_close(ours_w.detach(), theirs_w.detach(), rtol=1e-5, atol=1e-6)


def test_muon_in_bfloat16_takes_the_float32_step_to_bfloat16_precision():
    """--muon-ns-dtype bfloat16 changes the Newton-Schulz arithmetic, not the method."""
    steps = {}
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)
        model = small_model()
        optimizer = build_optimizer(model, "muon", lr=0.02, weight_decay=0.0, muon_ns_dtype=dtype)
        assert optimizer.ns_dtype == getattr(torch, dtype)
        before = model.blocks[0].mlp.fc1.weight.detach().clone()
        for param in model.parameters():
            param.grad = torch.randn(param.shape, generator=torch.Generator().manual_seed(1))
        optimizer.step()
        steps[dtype] = model.blocks[0].mlp.fc1.weight.detach() - before
    full, half = steps["float32"], steps["bfloat16"]
    assert full.abs().max() > 0 and not torch.equal(full, half)
    assert (half - full).norm() < 0.05 * full.norm()


def _muon_steps(rank: int, world: int, init_file: str, out_file: str, ns_dtype: str) -> None:
    """Three Muon steps on a small ViT with fixed gradients, in one of `world` processes, then
    one step of an optimizer told not to share; saves the weights and the matrices each
    orthogonalised."""
    if world > 1:
        torch.distributed.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
        )
    calls = []
    real = vit.training.optimizers.orthogonalize

    def counted(batch, steps, dtype):  # (b, m, n): b same-shaped matrices
        calls.extend([batch.shape[1:]] * len(batch))
        return real(batch, steps, dtype=dtype)

    vit.training.optimizers.orthogonalize = counted
    try:
        torch.manual_seed(0)
        model = small_model()
        optimizer = build_optimizer(
            model, "muon", lr=2e-3, weight_decay=0.05, muon_ns_dtype=ns_dtype
        )
        for step in range(3):
            generator = torch.Generator().manual_seed(step)  # the same gradients everywhere
            for param in model.parameters():
                param.grad = torch.randn(param.shape, generator=generator)
            optimizer.step()
        shared_calls = len(calls)
        alone = Muon(
            optimizer.param_groups, share_across_processes=False, ns_dtype=optimizer.ns_dtype
        )
        alone.step()
        alone_calls = len(calls) - shared_calls
    finally:
        vit.training.optimizers.orthogonalize = real
    result = {"state": model.state_dict(), "calls": shared_calls, "unshared": alone_calls}
    torch.save(result, f"{out_file}.{rank}")
    if world > 1:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("ns_dtype", ["float32", "bfloat16"])
def test_muon_under_ddp_shares_the_orthogonalisation_and_gives_bit_identical_weights(
    tmp_path, ns_dtype
):
    """Two processes each orthogonalise about half of the blocks; after the all-reduce (in
    bfloat16 for a bfloat16 iteration) both hold exactly the weights one process computes
    alone."""
    out = str(tmp_path / "weights")
    _muon_steps(0, 1, "", out + "-alone", ns_dtype)
    torch.multiprocessing.spawn(
        _muon_steps, args=(2, str(tmp_path / "init"), out, ns_dtype), nprocs=2, join=True
    )
    alone = torch.load(out + "-alone.0")
    shared = [torch.load(f"{out}.{rank}") for rank in (0, 1)]
    for name, weight in alone["state"].items():
        for result in shared:
            assert torch.equal(result["state"][name], weight), name
    per_step = alone["calls"] // 3  # 2 blocks x (3 qkv + proj + fc1 + fc2) = 12
    assert per_step == 12
    counts = [result["calls"] // 3 for result in shared]
    assert sum(counts) == per_step and min(counts) >= 4, counts
    # share_across_processes=False: every process orthogonalises every matrix again
    assert [result["unshared"] for result in shared] == [12, 12]


def test_share_work_balances_newton_schulz_flops_over_processes():
    shapes = [torch.Size((128, 128))] * 16 + [torch.Size((512, 128)), torch.Size((128, 512))] * 4
    owners = share_work(shapes, world=2)
    cost = [0, 0]
    for shape, owner in zip(shapes, owners, strict=True):
        cost[owner] += shape[0] * shape[1] * min(shape)
    assert abs(cost[0] - cost[1]) <= 128**3  # within one small block
    assert share_work(shapes, world=1) == [0] * len(shapes)


# -- schedules and augmentation ---------------------------------------------------------------
def test_patch_dropout_anneals_to_zero_over_the_last_epochs():
    cfg = TrainConfig(epochs=20, patch_drop=0.5, patch_drop_anneal=4)
    rates = [patch_drop_for_epoch(cfg, epoch) for epoch in range(20)]
    assert rates[:16] == [0.5] * 16
    assert rates[16:] == [0.375, 0.25, 0.125, 0.0]
    assert patch_drop_for_epoch(TrainConfig(epochs=20, patch_drop=0.5), 19) == 0.5


def test_mixup_off_epoch_ends_mixing_from_that_epoch_on():
    assert [mixup_on_for_epoch(TrainConfig(epochs=6, mixup_off_epoch=4), e) for e in range(6)] == [
        True, True, True, True, False, False,
    ]  # fmt: skip
    assert all(mixup_on_for_epoch(TrainConfig(epochs=6), e) for e in range(6))  # 0: never off
    torch.manual_seed(0)
    x, y = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    mixer = MixupCutmix(4, mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.1)
    mixer.enabled = False
    images, targets = mixer(x, y)
    assert torch.equal(images, x)
    assert torch.allclose(targets, one_hot(y, 4, smoothing=0.1))


def test_training_mixes_until_the_mixup_off_epoch(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    seen = []  # per call of the mixer: whether it was on
    mix = MixupCutmix.__call__

    def recording(self, x, y):
        seen.append(self.enabled)
        return mix(self, x, y)

    monkeypatch.setattr(MixupCutmix, "__call__", recording)
    flags = ("--cutmix", "1.0", "--mixup-off-epoch", "2")
    assert train_script.main(tiny_args(image_folder, tmp_path / "run", 3, *flags)) == 0
    steps = len(seen) // 3  # the same number of steps each epoch
    assert seen == [True] * (2 * steps) + [False] * steps


def test_alternating_flips_show_every_image_both_ways_over_two_epochs():
    images = torch.randint(0, 255, (40, 3, 8, 8), dtype=torch.uint8)
    images[..., :4] = 0  # left half dark: a flipped image has its dark half on the right
    batches = InMemoryBatches(
        images, list(range(40)), batch_size=8, mean=(0, 0, 0), std=(1, 1, 1), pad=0,
        hflip_alternate=True, seed=3,
    )  # fmt: skip
    flipped = {}
    for epoch in range(3):
        batches.set_epoch(epoch)
        for x, labels in batches:
            for image, label in zip(x, labels.tolist(), strict=True):
                flipped.setdefault(label, []).append(bool(image[..., :4].sum() > 0))
    assert all(len(v) == 3 and v[0] != v[1] and v[0] == v[2] for v in flipped.values())
    assert 10 < sum(v[0] for v in flipped.values()) < 30  # a random half starts flipped


def repeated_batches(repeats: int, **options) -> InMemoryBatches:
    """48 random images (the same each call) labelled by their index, in batches of 12 with
    pad-crop and flips."""
    same = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (48, 3, 8, 8), dtype=torch.uint8, generator=same)
    return InMemoryBatches(
        images, list(range(48)), batch_size=12, mean=(0, 0, 0), std=(1, 1, 1),
        aug_repeats=repeats, seed=5, **options,
    )  # fmt: skip


def test_repeated_augmentation_takes_each_image_n_times_in_a_row_each_copy_its_own():
    batches = repeated_batches(3)
    batches.set_epoch(1)
    pairs = [pair for x, labels in batches for pair in zip(x, labels.tolist(), strict=True)]
    labels = [label for _, label in pairs]
    assert len(labels) == 48  # an epoch is as many samples as without repeats ...
    assert len(set(labels)) == 16  # ... of a third of the images, each three times in a row
    triples = [pairs[i : i + 3] for i in range(0, 48, 3)]
    assert all(len({label for _, label in triple}) == 1 for triple in triples)
    # each copy is cropped and flipped on its own: no copy equals the one before it
    assert all(not torch.equal(a[0], b[0]) for t in triples for a, b in itertools.pairwise(t))
    batches.set_epoch(2)
    assert {label for _, labels in batches for label in labels.tolist()} != set(labels)


def test_repeated_augmentation_across_as_many_processes_gives_each_one_copy():
    """DeiT's layout: with 3 processes and 3 repeats every process sees the epoch's same
    images in the same order, each its own augmented copy."""
    ranks = [repeated_batches(3, rank=rank, world_size=3) for rank in range(3)]
    labels = [[label for _, y in batches for label in y.tolist()] for batches in ranks]
    assert labels[0] == labels[1] == labels[2] and len(set(labels[0])) == 12  # one batch each
    first = [next(iter(batches))[0] for batches in ranks]
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])


def test_repeated_alternating_flips_show_an_images_copies_both_ways():
    images = torch.randint(0, 255, (40, 3, 8, 8), dtype=torch.uint8)
    images[..., :4] = 0  # left half dark, as above
    batches = InMemoryBatches(
        images, list(range(40)), batch_size=8, mean=(0, 0, 0), std=(1, 1, 1), pad=0,
        hflip_alternate=True, aug_repeats=2, seed=3,
    )  # fmt: skip
    for epoch in range(2):
        batches.set_epoch(epoch)
        flipped = {}
        for x, labels in batches:
            for image, label in zip(x, labels.tolist(), strict=True):
                flipped.setdefault(label, []).append(bool(image[..., :4].sum() > 0))
        assert len(flipped) == 20 and all(sorted(v) == [False, True] for v in flipped.values())


def test_the_per_image_loader_repeats_in_the_same_layout():
    """RepeatAugSampler: every image of the shuffle three times in a row, dealt to the processes
    in turn; an epoch as many samples as without repeats."""
    sampler = RepeatAugSampler(30, repeats=3, num_replicas=1, rank=0, seed=0)
    pairs = list(sampler)
    assert len(pairs) == len(sampler) == 30 and len({index for index, _ in pairs}) == 10
    assert [copy for _, copy in pairs] == [0, 1, 2] * 10
    assert all(len({index for index, _ in pairs[i : i + 3]}) == 1 for i in range(0, 30, 3))
    sampler.set_epoch(1)
    assert list(sampler) != pairs
    ranks = [
        list(RepeatAugSampler(30, repeats=3, num_replicas=3, rank=r, seed=0)) for r in range(3)
    ]
    assert [index for index, _ in ranks[0]] == [index for index, _ in ranks[2]]
    assert [{copy for _, copy in rank} for rank in ranks] == [{0}, {1}, {2}]


def test_each_copy_of_an_image_draws_its_own_per_image_augmentation():
    same = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (4, 32, 32, 3), dtype=torch.uint8, generator=same).numpy()
    preprocess = vit.create_model("vit_cifar_patch4_32", depth=1).preprocess
    dataset = ImageDataset(labels=[0, 1, 0, 1], class_names=["a", "b"], images=images)
    dataset = dataset.with_transform(train_transform(preprocess, AugmentConfig(crop="pad")))
    first, copy0 = dataset[2][0], dataset[(2, 0)][0]
    assert torch.equal(first, copy0)  # copy 0 keeps the draws of a run without repeats
    assert not torch.equal(copy0, dataset[(2, 1)][0]) and not torch.equal(copy0, dataset[(2, 2)][0])
    assert torch.equal(dataset[(2, 1)][0], dataset[(2, 1)][0])  # and each copy its own, again


def test_train_py_repeats_in_the_per_image_loader_and_resumes_exactly(
    image_folder, tmp_path, train_script, monkeypatch
):
    from conftest import assert_resumes_exactly

    flags = ("--aug-repeats", "3", "--workers", "1")  # a worker: (index, copy) pairs cross to it
    assert_resumes_exactly(train_script, monkeypatch, tmp_path, image_folder, *flags)


# -- defaults --------------------------------------------------------------------------------------
HEAVY_RECIPE = {
    "epochs": 200, "batch_size": 128, "lr": 1e-3, "label_smoothing": 0.1, "mixup": 0.8,
    "cutmix": 1.0, "drop_path": 0.1, "aa": "randaug", "aa_n": 2, "reprob": 0.25, "hflip": 0.5,
    "crop": "pad", "model_ema": True, "weight_decay": 0.05, "clip_grad": 1.0, "opt": "adamw",
}  # fmt: skip


def test_defaults_are_light_and_the_200_epoch_recipes_keep_every_heavy_setting(train_script):
    """A short run with default flags must learn: no RandAugment, MixUp, CutMix, erasing or
    stochastic depth by default; the GPU recipes' YAML files still turn each of them on."""
    defaults = train_script.parse_config([])
    assert (defaults.aa, defaults.mixup, defaults.cutmix) == ("none", 0.0, 0.0)
    assert (defaults.reprob, defaults.drop_path) == (0.0, 0.0)
    assert resolve_optimizer(defaults) == "muon" and defaults.batch_size == 64  # from scratch
    assert resolve_optimizer(train_script.parse_config(["--pretrained", "w.pth"])) == "adamw"
    assert resolve_optimizer(train_script.parse_config(["--opt", "adamw"])) == "adamw"
    for name in ("cifar10", "cifar100"):
        recipe = train_script.parse_config(["--config", f"configs/{name}.yaml"])
        assert {key: getattr(recipe, key) for key in HEAVY_RECIPE} == HEAVY_RECIPE, name
