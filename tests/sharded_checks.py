"""Sharding checks, run by tests/test_sharding.py in a subprocess with 8 CPU devices.

    python tests/sharded_checks.py CHECK[,CHECK...] [xla|pallas]

where each CHECK is one of batch, channel, spatial, explicit and train_step. Each
check compares every op's sharded result with the unsharded one and inspects the
compiled HLO for collectives; checks run in one process share its start-up and
the unsharded results. It exits non-zero with a message on the first failure.
(A subprocess, because the device count is fixed when JAX starts.)
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


def main(checks: list[str], implementation: str | None) -> None:
    import gc

    import jax
    from helpers import SUITE_GC_THRESHOLDS

    gc.set_threshold(*SUITE_GC_THRESHOLDS)  # as in the suite's own processes

    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_enable_x64", False)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxgrad

    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    if "explicit" in checks:  # JAX's sharding in types
        if len(checks) > 1:
            raise SystemExit("explicit runs alone: its mesh's axes are explicit")
        mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
    rng = np.random.default_rng(0)

    def arr(*shape):
        return jnp.asarray(rng.normal(size=shape).astype(np.float32))

    x, dy_up = arr(8, 16, 16, 8), arr(8, 32, 32, 8)
    f, dy_conv = arr(3, 3, 8, 2), arr(8, 16, 16, 16)
    f7 = arr(7, 7, 8, 2)  # a large filter: XLA's filter gradient loops over kernel rows
    # With a multiplier of 2 the kernels read each input channel once and repeat it
    # in registers; with 3, once for each of its output channels.
    f3, dy_conv3 = arr(3, 3, 8, 3), arr(8, 16, 16, 24)
    # The ops' implementation: None (the default), "xla", or "pallas" (the kernels
    # run interpreted on the CPU devices, each inside one device's shard).
    conv_kw = dict(strides=(1, 1), padding="SAME", implementation=implementation)
    up = dict(mode="linear", implementation=implementation)

    def conv(x, f):
        return jaxgrad.depthwise_conv2d(x, f, **conv_kw)

    def conv_grads(x, f, g):
        return jax.vjp(conv, x, f)[1](g)

    def resample_vjp(x, g):
        return jax.vjp(lambda x: jaxgrad.resample(x, (1, 2, 2, 1), **up), x)[1](g)[0]

    # name: (function, arguments, whether its compiled form may hold one all-reduce when
    # the batch is sharded: the filter gradient sums over the batch)
    ops = {
        "relu": (jaxgrad.relu, (x,), False),
        "relu_grad": (jaxgrad.relu_grad, (x, x), False),
        "relu vjp": (lambda x, g: jax.vjp(jaxgrad.relu, x)[1](g)[0], (x, x), False),
        "resample": (lambda x: jaxgrad.resample(x, (1, 2, 2, 1), **up), (x,), False),
        "resample nearest": (
            lambda x: jaxgrad.resample(x, (1, 0.5, 0.5, 1), implementation=implementation),
            (x,),
            False,
        ),
        "resample_grad": (
            lambda g: jaxgrad.resample_grad(g, x.shape, (1, 2, 2, 1), **up),
            (dy_up,),
            False,
        ),
        "resample vjp": (resample_vjp, (x, dy_up), False),
        "resize": (lambda x: jaxgrad.resize(x, (8, 24, 20, 8), **up), (x,), False),
        "depthwise_conv2d": (conv, (x, f), False),
        "backprop_input": (
            lambda f, g: jaxgrad.depthwise_conv2d_backprop_input(x.shape, f, g, **conv_kw),
            (f, dy_conv),
            False,
        ),
        "backprop_filter": (
            lambda x, g: jaxgrad.depthwise_conv2d_backprop_filter(x, f.shape, g, **conv_kw),
            (x, dy_conv),
            True,
        ),
        "depthwise vjp": (conv_grads, (x, f, dy_conv), True),
        "depthwise vjp, M=3": (conv_grads, (x, f3, dy_conv3), True),
    }
    if implementation != "pallas":  # interpreted, a 7x7 kernel is slow to compile
        ops["depthwise vjp 7x7"] = (conv_grads, (x, f7, dy_conv), True)
    else:  # relu has one implementation, which the default's checks cover
        ops = {name: op for name, op in ops.items() if not name.startswith("relu")}

    def spec(a, axis):
        """Shards an activation on ``axis``; filters ([k, k, C, M]) follow the channels."""
        if a.shape[:2] in ((3, 3), (7, 7)):
            return P(None, None, "d", None) if axis == 3 else P()
        parts = [None] * a.ndim
        parts[axis] = "d"
        return P(*parts)

    def collectives(hlo):
        """Every collective instruction in the compiled HLO, one entry per occurrence."""
        return sorted(c for c in COLLECTIVES for _ in re.finditer(rf" {c}(-start)?\(", hlo))

    unsharded = {}  # name: the unsharded result, computed once

    def unsharded_result(name, fn, args):
        if name not in unsharded:
            unsharded[name] = jax.jit(fn)(*args)
        return unsharded[name]

    def close(got, expected, tol, message):
        for e, g in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
            # Per device, XLA may sum in another order: rounding errors scale with
            # the terms (the largest results), not with the cancelled small ones.
            scale = max(1.0, float(np.abs(np.asarray(e, np.float64)).max(initial=0.0)))
            np.testing.assert_allclose(
                np.asarray(g), np.asarray(e), rtol=tol, atol=tol * scale, err_msg=message
            )

    def compare(name, fn, args, axis, tol):
        """Checks ``fn`` on ``args`` sharded on ``axis`` against the unsharded
        result; returns the sharded program's optimized HLO."""
        expected = unsharded_result(name, fn, args)
        sharded = [jax.device_put(a, NamedSharding(mesh, spec(a, axis))) for a in args]
        program = jax.jit(fn).lower(*sharded).compile()
        got = program(*sharded)
        close(got, expected, tol, f"{name} sharded on axis {axis}")
        return program.as_text()

    def check_collectives(name, hlo, check, reduces_batch):
        found = collectives(hlo)
        allowed = ["all-reduce"] if (reduces_batch and check == "batch") else []
        if found != allowed:
            raise SystemExit(f"{name} sharded by {check}: collectives {found}, expected {allowed}")
        return found

    def types_follow_primals(name, fn, args, specs, mesh=mesh):
        """Explicitly sharded, every gradient has its primal's type (a custom VJP's
        rule), however the primals are cut; each equals the unsharded gradient."""
        grad = jax.grad(fn, tuple(range(len(args))))
        expected = unsharded_result(fn.__name__, grad, args)
        sharded = [
            jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs, strict=True)
        ]
        got = jax.jit(grad)(*sharded)
        for a, g in zip(sharded, got, strict=True):
            if jax.typeof(g).sharding.spec != jax.typeof(a).sharding.spec:
                raise SystemExit(f"{name}: gradient {jax.typeof(g)} for primal {jax.typeof(a)}")
        close(got, expected, 1e-5, name)
        print(f"ok explicit {name}: {[str(s) for s in specs]}")

    def conv_loss(x, f):
        return jnp.sum(conv(x, f) ** 2)

    def resample_loss(x):
        return jnp.sum(jaxgrad.resample(x, (1, 2, 2, 1), **up) ** 2)

    def result_type_cases():
        """name: (function, arguments, their cuts, the cut the result must have)."""
        rows, columns = P(None, "d", None, None), P(None, None, "d", None)
        whole = P(None, None, None, None)

        def valid(x, f):  # 16 rows in, 14 out: 8 devices no longer divide them
            return jaxgrad.depthwise_conv2d(x, f, (1, 1), "VALID", implementation=implementation)

        cases = {
            "conv, rows cut": (conv, (x, f), (rows, P()), rows),
            "conv VALID, rows cut": (valid, (x, f), (rows, P()), whole),
            "backprop_input, rows cut": (ops["backprop_input"][0], (f, dy_conv), (P(), rows), rows),
            "resample 2x, rows cut": (ops["resample"][0], (x,), (rows,), rows),
            "resample_grad, rows cut": (ops["resample_grad"][0], (dy_up,), (rows,), rows),
            "resize to 20 columns, columns cut": (ops["resize"][0], (x,), (columns,), whole),
        }
        if implementation == "pallas":  # the rule is the op's; one case per kernel family
            cases = {n: cases[n] for n in ("conv, rows cut", "resample 2x, rows cut")}
        return cases

    def explicit_result_types():
        """A result keeps its first activation's cut of every axis whose new
        length the mesh axes divide, as ``lax.conv_general_dilated`` keeps it: a
        spatial cut survives a convolution or a resampling, and is dropped where
        the length no longer divides. Each result equals the unsharded one."""
        for name, (fn, args, specs, expected) in result_type_cases().items():
            sharded = [
                jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs, strict=True)
            ]
            got = jax.jit(fn)(*sharded)
            if jax.typeof(got).sharding.spec != expected:
                raise SystemExit(f"{name}: result {jax.typeof(got)}, expected the cut {expected}")
            close(got, unsharded_result(name, fn, args), 1e-5, name)
            print(f"ok explicit result type, {name}: {jax.typeof(got)}")

    def explicit_replicated():
        """Arrays that no type shards, in a jit under the mesh: the kernels run
        there too (JAX 0.11 refused custom_partitioning there)."""
        for name in ("resample", "depthwise_conv2d"):
            fn, args, _ = ops[name]
            close(jax.jit(fn)(*args), unsharded_result(name, fn, args), 1e-5, name)
        print("ok explicit replicated arrays under the mesh")

    def explicit_mixed_cuts():
        """Shardings that batch- and channel-cut checks leave out: a filter cut
        unlike the input (FSDP cuts parameters along the data axis), a replicated
        filter with cut channels, and cut spatial axes."""
        cases = {
            "conv, batch cut, filter cut on channels": (P("d"), P(None, None, "d")),
            "conv, channels cut, filter whole": (P(None, None, None, "d"), P()),
            "conv, rows cut": (P(None, "d"), P()),
            "conv, columns cut, filter cut on channels": (P(None, None, "d"), P(None, None, "d")),
        }
        if implementation == "pallas":
            # The layout is the op's, not the kernels': they see it as they see
            # batch and channel cuts. One spatial cut checks that they do.
            cases = {name: cases[name] for name in ("conv, rows cut",)}
        for name, specs in cases.items():
            types_follow_primals(name, conv_loss, (x, f), specs)

        def conv_loss_m3(x, f3):  # its own name: unsharded results are kept by name
            return conv_loss(x, f3)

        types_follow_primals("conv M=3, batch cut", conv_loss_m3, (x, f3), (P("d"), P()))
        # Data and model parallel at once: batch and channels cut over two mesh axes.
        explicit = (jax.sharding.AxisType.Explicit,) * 2
        grid = jax.make_mesh((4, 2), ("data", "model"), axis_types=explicit)
        with jax.set_mesh(grid):
            types_follow_primals(
                "conv, batch and channels cut over a 4x2 mesh",
                conv_loss,
                (x, f),
                (P("data", None, None, "model"), P(None, None, "model")),
                mesh=grid,
            )
        # An output of no columns (a 3-wide window over 1 column at stride 3):
        # the gradients are zeros, typed as their primals.
        thin = x[:, :, :1]

        def empty_conv_loss(thin, f):
            y = jaxgrad.depthwise_conv2d(thin, f, (3, 3), "VALID", implementation=implementation)
            return jnp.sum(y**2)

        types_follow_primals("conv, no output columns", empty_conv_loss, (thin, f), (P("d"), P()))
        types_follow_primals("resample, rows cut", resample_loss, (x,), (P(None, "d"),))
        types_follow_primals(
            "resample, channels cut", resample_loss, (x,), (P(None, None, None, "d"),)
        )

    def explicit_without_set_mesh():
        """Arrays whose types name the explicit mesh need no ``jax.set_mesh``, for
        JAX's ops or jaxgrad's (``jax.make_mesh`` makes explicit axes by default):
        the ops that lay their arrays out (and a large filter's loop, which lays
        out its carry), batch-cut, give the unsharded results, and gradients keep
        their primals' types."""
        for name in ("resample vjp", "depthwise vjp", "depthwise vjp 7x7"):
            if name in ops:
                fn, args, _ = ops[name]
                compare(name, fn, args, 0, 1e-5)
        # A filter made inside the function: its type names no mesh.
        compare(
            "conv, filter made inside", lambda x: conv(x, jnp.full(f.shape, 0.1)), (x,), 0, 1e-5
        )
        types_follow_primals("conv, batch cut, no jax.set_mesh", conv_loss, (x, f), (P("d"), P()))
        types_follow_primals(
            "resample, rows cut, no jax.set_mesh", resample_loss, (x,), (P(None, "d"),)
        )
        print("ok explicit sharding without jax.set_mesh")

    def inside_shard_map():
        """In a ``jax.shard_map`` over the batch (a data-parallel step written by
        hand), the gradients equal the unsharded ones: the shared filter's is the
        sum over the devices, as for JAX's own ops. Automatic and explicit meshes."""

        def loss(x, f):
            y = jaxgrad.relu(conv(x, f))
            return jnp.sum(jaxgrad.resample(y, (1, 2, 2, 1), **up) ** 2)

        grad = jax.grad(loss, (0, 1))
        expected = jax.jit(grad)(x, f)
        explicit = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
        for on in (mesh, explicit):
            local = jax.shard_map(grad, mesh=on, in_specs=(P("d"), P()), out_specs=(P("d"), P()))
            placed = (
                jax.device_put(x, NamedSharding(on, P("d"))),
                jax.device_put(f, NamedSharding(on, P())),
            )
            close(jax.jit(local)(*placed), expected, 1e-5, f"shard_map on {on.axis_types}")
        print("ok gradients inside jax.shard_map, automatic and explicit meshes")

    for check in checks:
        if check in ("batch", "channel"):
            axis = 0 if check == "batch" else 3
            for name, (fn, args, reduces_batch) in ops.items():
                hlo = compare(name, fn, args, axis, 1e-5)
                found = check_collectives(name, hlo, check, reduces_batch)
                print(f"ok {check:8} {name:18} collectives {found}")
            if check == "batch" and implementation != "pallas":  # interpreted, it cannot run there
                inside_shard_map()
        elif check == "spatial":
            # Sharding an axis that is resampled or convolved: halos and gathers cross
            # devices, so collectives are allowed; the result must still be right.
            for name, (fn, args, _) in ops.items():
                compare(name, fn, args, 1, 1e-5)
                print(f"ok spatial  {name}")
        elif check == "explicit":
            # Each array's sharding is part of its type, and the ops trace with it:
            # batch- or channel-sharded, each op gives the unsharded result with the
            # collectives of automatic sharding. Unsharded results are computed first,
            # outside the mesh: under it the kernels would run on every device.
            cut_ops = ops
            if implementation == "pallas":
                # The kernels run under shard_map, wrapped kernel by kernel: the
                # VJPs launch the public gradients' kernels, with the same wrappers.
                left_out = ("backprop_input", "backprop_filter", "resample vjp")
                cut_ops = {name: op for name, op in ops.items() if name not in left_out}
            for name, (fn, args, _) in cut_ops.items():
                unsharded_result(name, fn, args)
            unsharded_result("conv_loss", jax.grad(conv_loss, (0, 1)), (x, f))
            unsharded_result("resample_loss", jax.grad(resample_loss, (0,)), (x,))
            for name, (fn, args, _, _) in result_type_cases().items():
                unsharded_result(name, fn, args)
            with jax.set_mesh(mesh):
                for axis, cut in ((0, "batch"), (3, "channel")):
                    for name, (fn, args, reduces_batch) in cut_ops.items():
                        hlo = compare(name, fn, args, axis, 1e-5)
                        found = check_collectives(name, hlo, cut, reduces_batch)
                        print(f"ok explicit {cut:8} {name:18} collectives {found}")
                explicit_mixed_cuts()
                explicit_result_types()
                explicit_replicated()
            explicit_without_set_mesh()
        elif check == "train_step":
            sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
            import unet

            key = jax.random.key(0)
            params = unet.init_params(key)
            opt = unet.adam_init(params)
            noisy, clean = unet.make_batch(jax.random.key(1), 8, 32)
            step = jax.jit(unet.train_step)
            one = step(params, opt, noisy, clean)
            explicit = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
            for on in (mesh, explicit):  # automatic sharding, then sharding in types
                rep, by_batch = NamedSharding(on, P()), NamedSharding(on, P("d"))
                with jax.set_mesh(on) if on is explicit else contextlib.nullcontext():
                    many = step(
                        jax.device_put(params, rep),
                        jax.device_put(unet.adam_init(params), rep),
                        jax.device_put(noisy, by_batch),
                        jax.device_put(clean, by_batch),
                    )
                for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(many), strict=True):
                    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-6)
            print("ok train step on 8 devices equals 1 device, automatic and explicit sharding")
        else:
            raise SystemExit(f"unknown check {check!r}")


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2] if len(sys.argv) > 2 else None)
