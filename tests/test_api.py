"""The public API's shape: explicit exports, keyword-only options, documented examples."""

import inspect

import pytest

import jaxgrad

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
