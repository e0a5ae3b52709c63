"""The public API's shape: explicit exports, keyword-only options, documented examples."""

import functools
import inspect
import logging
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import H100_CAPABILITY, TRITON_CALL, gpu_stand_in, lowered_text, needs_kernels
from jax import export

import jaxgrad
from jaxgrad import _implementation
from jaxgrad._depthwise import _ops as _depthwise_ops
from jaxgrad._depthwise import _xla as _depthwise_xla
from jaxgrad._resample import _ops as _resample_ops

PUBLIC = [getattr(jaxgrad, name) for name in jaxgrad.__all__]

# resize(x, output_shape=None, *, scales=None): output_shape is the primary argument,
# optional only because scales may replace it (ONNX Resize's sizes-or-scales), so it
# stays positional, as the API issue specifies.
POSITIONAL_OPTIONAL = {"resize": {"output_shape"}}


def test_all_names_exist_and_are_sorted_uniquely():
    assert len(set(jaxgrad.__all__)) == len(jaxgrad.__all__)
    for name in jaxgrad.__all__:
        assert hasattr(jaxgrad, name), name


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__name__)
def test_optional_arguments_are_keyword_only(fn):
    for param in inspect.signature(fn).parameters.values():
        if param.name in POSITIONAL_OPTIONAL.get(fn.__name__, set()):
            continue
        if param.default is not inspect.Parameter.empty:
            assert param.kind is inspect.Parameter.KEYWORD_ONLY, (
                f"{fn.__name__}: optional argument {param.name} must be keyword-only"
            )


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__name__)
def test_docstring_has_sections_and_example(fn):
    doc = inspect.getdoc(fn)
    assert doc, f"{fn.__name__} has no docstring"
    for section in ("Args:", "Returns:", "Raises:", "Examples:", "References:"):
        assert section in doc, f"{fn.__name__}: docstring lacks {section}"
    assert ">>> " in doc, f"{fn.__name__}: docstring has no doctest example"


def test_py_typed_is_shipped():
    import pathlib

    assert (pathlib.Path(jaxgrad.__file__).parent / "py.typed").exists()


class _Compiles(logging.Handler):
    """Collects JAX's "Compiling ..." log records (under jax.log_compiles)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        if record.getMessage().startswith("Compiling"):
            self.names.append(record.getMessage().split()[1])


@pytest.mark.parametrize(
    "call",
    [
        lambda x, f: jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME"),
        lambda x, f: jaxgrad.depthwise_conv2d_backprop_input(x.shape, f, x, (1, 1), "SAME"),
        lambda x, f: jaxgrad.depthwise_conv2d_backprop_filter(x, f.shape, x, (1, 1), "SAME"),
        lambda x, f: jaxgrad.resample(x, (1, 1.5, 1.5, 1), mode="linear"),
        lambda x, f: jaxgrad.resample_grad(x, (1, 6, 7, 2), (1, 1.5, 1.25, 1)),
        lambda x, f: jaxgrad.resize(x, (1, 5, 4, 2), mode="linear"),
    ],
    ids=["conv", "backprop_input", "backprop_filter", "resample", "resample_grad", "resize"],
)
def test_an_eager_call_runs_one_compiled_program(call):
    # Eagerly, an op compiles once per static configuration and runs that one
    # program, instead of dispatching each of its many operations on its own
    # (which made an eager 7x7 depthwise_conv2d ~100x slower than a jitted one).
    x, f = jnp.ones((1, 9, 9, 2)), jnp.ones((7, 7, 2, 1))
    compiles = _Compiles()
    logger = logging.getLogger("jax")
    logger.addHandler(compiles)
    try:
        with jax.log_compiles():
            call(x, f)
            first = list(compiles.names)
            call(x, f)
    finally:
        logger.removeHandler(compiles)
    assert len(first) == 1, f"the first call compiled {first}"
    assert compiles.names == first, "the second call compiled again"


@pytest.mark.parametrize(
    ("ops", "op"),
    [
        (  # a filter made of x: every derivative needs both gradients
            _depthwise_ops,
            lambda x: jaxgrad.depthwise_conv2d(x, jnp.sin(x[0, :3, :3, :, None]), (1, 1), "SAME"),
        ),
        (_resample_ops, lambda x: jaxgrad.resample(x, (1, 1.5, 1.5, 1), mode="linear")),
    ],
    ids=["depthwise", "resample"],
)
def test_higher_derivatives_trace_each_op_once(ops, op, monkeypatch):
    # Each op's backward calls the other ops of its set, and their backwards call
    # it again: a derivative of order n meets an op about 3**n times (depthwise;
    # 2**n for resample; a third-order depthwise derivative traced the arithmetic
    # 40 times, not 4). Called through the ops' compiled cores, each configuration
    # is traced once and reused.
    traced = []
    run = ops._run
    monkeypatch.setattr(ops, "_run", lambda *a, **k: traced.append(a) or run(*a, **k))
    x = jnp.ones((1, 8, 8, 2))

    def traces(order):
        jax.clear_caches()
        traced.clear()
        fn = lambda x: jnp.sum(op(x) ** 2)  # noqa: E731
        for _ in range(order):
            fn = lambda x, fn=fn: jnp.sum(jnp.sin(jax.grad(fn)(x)))  # noqa: E731
        jax.jit(fn).trace(x)
        return len(traced)

    assert traces(3) == traces(1) > 0


@pytest.mark.parametrize(
    ("ops", "op", "expected"),
    [
        (  # a filter made of x: the forward and both gradients
            _depthwise_ops,
            lambda x: jaxgrad.depthwise_conv2d(x, jnp.sin(x[0, :3, :3, :, None]), (1, 1), "SAME"),
            [
                "depthwise_conv2d",
                "depthwise_conv2d_backprop_filter",
                "depthwise_conv2d_backprop_input",
            ],
        ),
        (  # the map and its transpose
            _resample_ops,
            lambda x: jaxgrad.resample(x, (1, 1.5, 1.5, 1), mode="linear"),
            [False, True],
        ),
    ],
    ids=["depthwise", "resample"],
)
def test_a_gradient_traces_each_op_once(ops, op, expected, monkeypatch):
    # Differentiating a jitted call, JAX traces the custom VJP's forward rule in
    # another context than the primal's (the same mesh, set where it was unset),
    # and the rule's call of the op missed the primal's trace: the forward's
    # arithmetic was traced twice. Each op is traced once, under jit and eagerly.
    traced = []
    run = ops._run
    monkeypatch.setattr(ops, "_run", lambda *a, **k: traced.append(a) or run(*a, **k))
    x = jnp.ones((1, 8, 8, 2))
    loss = lambda x: jnp.sum(op(x) ** 2)  # noqa: E731
    which = 0 if ops is _depthwise_ops else 2  # the op's name; resample's transpose flag
    for gradient in (jax.jit(jax.grad(loss)).trace, jax.grad(loss)):
        jax.clear_caches()
        traced.clear()
        gradient(x)
        assert sorted(a[which] for a in traced) == expected


@pytest.mark.parametrize("implementation", [None, pytest.param("pallas", marks=needs_kernels)])
def test_gradients_through_checkpoint_scan_and_cond(implementation):
    # Training code wraps layers in jax.checkpoint (recomputed in the backward),
    # lax.scan (one traced body for every layer) and lax.cond: each gives the
    # gradient of the plain loop, up to rounding (each is another program, which
    # XLA may fuse, and so round, differently).
    def layer(x, f):
        y = jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME", implementation=implementation)
        y = jaxgrad.resample(jaxgrad.relu(y), (1, 0.5, 0.5, 1), implementation=implementation)
        return jaxgrad.resample(y, (1, 2, 2, 1), mode="linear", implementation=implementation)

    def gradients(loss):
        x = jax.random.normal(jax.random.key(0), (2, 8, 8, 4), jnp.float32)
        filters = jax.random.normal(jax.random.key(1), (1, 3, 3, 4, 1), jnp.float32)
        return jax.jit(jax.grad(lambda x, fs: (loss(x, fs) ** 2).sum(), argnums=(0, 1)))(x, filters)

    def looped(step):
        return lambda x, filters: functools.reduce(step, filters, x)

    def scanned(step):
        return lambda x, filters: jax.lax.scan(lambda x, f: (step(x, f), None), x, filters)[0]

    plain = gradients(looped(layer))
    remat = gradients(looped(jax.checkpoint(layer)))
    cond = gradients(looped(lambda x, f: jax.lax.cond(True, layer, lambda x, f: x, x, f)))
    scan = gradients(scanned(jax.checkpoint(layer)))
    close = functools.partial(np.testing.assert_allclose, rtol=2e-5, atol=1e-5)
    jax.tree.map(close, (remat, cond, scan), (plain, plain, plain))


# None and "xla": on the CPU the default is the "xla" program itself, which one run
# covers.
DEFAULT_AND_XLA = [None] if jax.default_backend() == "cpu" else [None, "xla"]


@pytest.mark.parametrize("filter_shape", [(3, 3, 4, 1), (7, 7, 4, 1), (3, 3, 4, 3)])
@pytest.mark.parametrize("implementation", DEFAULT_AND_XLA)
def test_gradients_inside_shard_map(filter_shape, implementation):
    # jax.shard_map types how each array varies across its manual axes, and a
    # gradient must have its primal's type: the filter every device shares gets
    # the sum of the devices' gradients, as JAX's own ops give it. (Pallas'
    # interpret mode does not run inside a shard_map that checks these types; the
    # kernels' results are typed as their operands vary, for the GPU.)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    kw = dict(implementation=implementation)

    def loss(x, f):
        y = jaxgrad.relu(jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME", **kw))
        y = jaxgrad.resample(y, (1, 0.5, 0.5, 1), **kw)
        y = jaxgrad.resize(y, (2, 10, 10, y.shape[-1]), mode="linear", **kw)
        return (y**2).sum()

    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 4), jnp.float32)
    f = jax.random.normal(jax.random.key(1), filter_shape, jnp.float32)
    grad = jax.grad(loss, argnums=(0, 1))
    spec = jax.sharding.PartitionSpec
    sharded = jax.shard_map(
        grad, mesh=mesh, in_specs=(spec("d"), spec()), out_specs=(spec("d"), spec())
    )
    got, want = jax.jit(sharded)(x, f), jax.jit(grad)(x, f)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-6), got, want)


def test_kernel_results_vary_as_their_operands_inside_shard_map():
    # With the kernels (on a GPU), inside jax.shard_map each pallas_call's result
    # must be typed as varying across the manual axes its operands vary across.
    from jaxgrad import _kernels, _sharding

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    struct = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    assert _kernels.varying_as(struct, [jnp.ones(3)]) is struct  # outside: as it is
    seen = []

    def body(x, w):
        seen.append(_kernels.varying_as(struct, [w]))  # w is the same on every device
        seen.append(_kernels.varying_as((struct, struct), [w, x]))  # x varies
        assert _sharding.varying(x) == {"d"} and not _sharding.varying(w)
        return x

    spec = jax.sharding.PartitionSpec
    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec("d"), spec()), out_specs=spec("d")))(
        jnp.ones(4), jnp.ones(4)
    )
    one, (two, three) = seen
    assert one is struct  # no operand varies
    for typed in (two, three):
        assert (typed.shape, typed.dtype) == (struct.shape, struct.dtype)
        manual = getattr(typed, "manual_axis_type", None)
        assert (manual.varying if manual is not None else typed.vma) == {"d"}


@needs_kernels
def test_one_jitted_step_lowers_for_every_backend(patch):
    # A step through every op family, jitted once, lowers for each platform a user
    # may run it on: the Pallas kernels where the program is for a CUDA GPU (the
    # process is given one here: the choice is made at lowering), the portable
    # arithmetic everywhere else.
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    x, f = jnp.ones((2, 8, 8, 4), jnp.float32), jnp.ones((3, 3, 4, 2), jnp.float32)

    def loss(x, f):
        y = jaxgrad.relu(jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME"))
        y = jaxgrad.resample(y, (1, 2, 2, 1), mode="linear")
        return (jaxgrad.resize(y, (2, 10, 10, 8), mode="linear") ** 2).sum()

    step = jax.grad(loss, argnums=(0, 1))
    for platform in ("cpu", "tpu", "rocm", "cuda"):
        kernels = lowered_text(step, x, f, platform=platform).count(TRITON_CALL)
        assert (kernels > 0) == (platform == "cuda"), (platform, kernels)


def test_the_kernels_need_every_gpu_to_be_an_ampere_or_newer(patch):
    # The lowest compute capability among the process's CUDA GPUs decides.
    gpu = lambda capability: types.SimpleNamespace(compute_capability=capability)  # noqa: E731
    patch(jax, "devices", lambda backend: [gpu("9.0"), gpu("12.0")])
    assert _implementation._cuda_capability.__wrapped__() == (9, 0)
    patch(jax, "devices", lambda backend: [gpu("9.0"), gpu("7.5")])
    assert _implementation._cuda_capability.__wrapped__() == (7, 5)

    def no_cuda_backend(backend):
        raise RuntimeError(f"Unknown backend {backend}")

    patch(jax, "devices", no_cuda_backend)
    assert _implementation._cuda_capability.__wrapped__() is None


@needs_kernels
def test_exported_for_cuda_where_there_is_a_gpu_holds_the_kernels(patch):
    # docs/export.md: where the process has a CUDA GPU (given one here), a program
    # exported for CUDA holds the Triton kernels, which jax.export refuses to
    # serialize unless their custom call's check is disabled. (The page's doctest
    # exports from this CPU process, for several platforms.)
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    x, f = jnp.ones((2, 8, 8, 4), jnp.float32), jnp.ones((3, 3, 4, 1), jnp.float32)

    def loss(x, f):
        y = jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME")
        return (jaxgrad.resample(y, (1, 2, 2, 1), mode="linear") ** 2).sum()

    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    triton = export.DisabledSafetyCheck.custom_call(TRITON_CALL)
    with gpu_stand_in():
        with pytest.raises(ValueError, match="no compatibility guarantees"):
            export.export(step, platforms=("cuda",))(x, f)
        exported = export.export(step, platforms=("cuda",), disabled_checks=[triton])(x, f)
    assert exported.mlir_module().count(TRITON_CALL) > 0


# Each op with planned sums, on an operand with a symbolic length its plan reads
# (jax.export's shape polymorphism): the depthwise ops' rows, resampling's batch.
F = jnp.ones((3, 3, 4, 1), jnp.float32)
PLANNED = {
    "depthwise_conv2d": lambda x: jaxgrad.depthwise_conv2d(x, F, (1, 1), "SAME"),
    "depthwise_conv2d_backprop_input": lambda dy: jaxgrad.depthwise_conv2d_backprop_input(
        (2, 8, 8, 4), F, dy, (1, 1), "SAME"
    ),
    "depthwise_conv2d_backprop_filter": lambda x: jaxgrad.depthwise_conv2d_backprop_filter(
        x, F.shape, x, (1, 1), "SAME"
    ),
    "resample": lambda x: jaxgrad.resample(x, (1, 2, 2, 1), mode="linear"),
    "resample_grad": lambda dy: jaxgrad.resample_grad(dy, (2, 4, 4, 4), (1, 2, 2, 1)),
    "resize": lambda x: jaxgrad.resize(x, scales=(1, 2, 2, 1)),
}


@pytest.mark.parametrize("op", sorted(PLANNED))
def test_a_symbolic_length_is_refused_by_name(op):
    (length,) = export.symbolic_shape("n")
    shape = (2, length, 8, 4) if op.startswith("depthwise") else (length, 8, 8, 4)
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    with pytest.raises(TypeError, match=rf"{op}: \w+ must have a concrete shape, got \((2, )?n"):
        export.export(jax.jit(PLANNED[op]))(x)


def _depthwise_step(x, f, dy, data_format):
    """The three ops and a gradient through the forward, strided, with a multiplier."""
    kw = dict(data_format=data_format)
    y = jaxgrad.depthwise_conv2d(x, f, (2, 2), "SAME", **kw)
    dx = jaxgrad.depthwise_conv2d_backprop_input(x.shape, f, dy, (2, 2), "SAME", **kw)
    df = jaxgrad.depthwise_conv2d_backprop_filter(x, f.shape, dy, (2, 2), "SAME", **kw)
    loss = lambda x, f: (jaxgrad.depthwise_conv2d(x, f, (2, 2), "SAME", **kw) ** 2).sum()  # noqa: E731
    return y, dx, df, *jax.grad(loss, argnums=(0, 1))(x, f)


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_depthwise_exports_with_a_symbolic_batch(data_format):
    # No plan reads the batch: one artifact, for every platform, serves any batch,
    # with the bits of a program compiled for that batch.
    (batch,) = export.symbolic_shape("b")
    nhwc = data_format == "NHWC"
    x_shape = (batch, 7, 6, 3) if nhwc else (batch, 3, 7, 6)
    y_shape = (batch, 4, 3, 6) if nhwc else (batch, 6, 4, 3)
    step = jax.jit(functools.partial(_depthwise_step, data_format=data_format))
    specs = [
        jax.ShapeDtypeStruct(x_shape, jnp.float32),
        jax.ShapeDtypeStruct((3, 3, 3, 2), jnp.float32),
        jax.ShapeDtypeStruct(y_shape, jnp.float32),
    ]
    exported = export.export(step, platforms=("cpu", "cuda", "tpu"))(*specs)
    rng = np.random.default_rng(0)
    for n in (1, 3):
        args = [
            rng.normal(size=[n if d is batch else d for d in spec.shape]).astype(np.float32)
            for spec in specs
        ]
        for got, want in zip(exported.call(*args), step(*args), strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_symbolic_batch_is_summed_in_order_where_gpus_sum_it():
    # The filter gradient's fixed-order sum on GPUs adds a symbolic batch up in a
    # loop, in the order of the unrolled sum of a concrete one: the same bits.
    (batch,) = export.symbolic_shape("b")
    tree_sum = jax.jit(functools.partial(_depthwise_xla._tree_sum, axes=(0, 1)))
    exported = export.export(tree_sum)(jax.ShapeDtypeStruct((batch, 5, 3), jnp.float32))
    partials = np.random.default_rng(1).normal(size=(6, 5, 3)).astype(np.float32)
    np.testing.assert_array_equal(exported.call(partials), tree_sum(partials))


def test_the_kernels_refuse_a_symbolic_batch(patch):
    # They launch programs per block of images: "pallas" raises, and the default
    # on a CUDA GPU computes with "xla" (no Triton call in the exported program).
    (batch,) = export.symbolic_shape("b")
    x = jax.ShapeDtypeStruct((batch, 8, 8, 4), jnp.float32)
    conv = functools.partial(jaxgrad.depthwise_conv2d, strides=(1, 1), padding="SAME")
    with pytest.raises(ValueError, match=r"cannot compute this case: a symbolic batch \(b\)"):
        export.export(jax.jit(lambda x: conv(x, F, implementation="pallas")))(x)
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    with gpu_stand_in():
        exported = export.export(jax.jit(lambda x: conv(x, F)), platforms=("cuda",))(x)
    assert TRITON_CALL not in exported.mlir_module()


def test_relu_exports_with_a_symbolic_batch():
    # Elementwise, relu and its gradient plan nothing: any batch runs one artifact.
    (batch,) = export.symbolic_shape("b")
    spec = jax.ShapeDtypeStruct((batch, 3), jnp.float32)
    exported = export.export(jax.jit(lambda x: jax.grad(lambda x: jaxgrad.relu(x).sum())(x)))(spec)
    for n in (1, 5):
        x = jnp.linspace(-1.0, 1.0, n * 3, dtype=jnp.float32).reshape(n, 3)
        np.testing.assert_array_equal(exported.call(x), (x > 0).astype(jnp.float32))
