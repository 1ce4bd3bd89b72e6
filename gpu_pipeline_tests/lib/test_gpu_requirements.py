"""Which device class a job's requirements leave, read with the ClassAd library."""

from __future__ import annotations

import pytest

from gpu_pipeline.lib.gpu_requirements import (
    ANY_DEVICE,
    UnreadableExpression,
    _conjuncts,
    device_class_of,
    expression_text,
)

A80, A40, T4 = "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "Tesla T4"
POOL = [A80, A40, T4]


@pytest.mark.parametrize(("require_gpus", "requirements", "want"), [
    # require_gpus = DeviceName == "...": that model
    (f'DeviceName == "{T4}"', None, T4),
    (f'DeviceName =?= "{A40}"', None, A40),
    # a pattern that leaves one model, and one that leaves two: a class is one model
    ('regexp("T4", DeviceName)', None, T4),
    ('regexp("A100", DeviceName)', None, ANY_DEVICE),
    # a refusal that leaves one model of the pool
    (f'DeviceName != "{T4}" && DeviceName != "{A40}"', None, A80),
    # no device test: properties the pool's states do not carry decide nothing
    ("Capability >= 8.0", None, ANY_DEVICE),
    ("GlobalMemoryMb >= 40000", None, ANY_DEVICE),
    ("true", None, ANY_DEVICE),
    (None, None, ANY_DEVICE),
    # an older pool's machine-ad test in Requirements, beside tests false for want of an attribute
    # (`is` reads an undefined attribute as not true) and undefined ones
    (None, f'(HAS_SINGULARITY is true) && (TARGET.GPUs_DeviceName == "{T4}") && '
           "(TARGET.Memory >= RequestMemory) && (TARGET.Arch == \"X86_64\")", T4),
    (None, f'((TARGET.CUDADeviceName =?= "{A80}") && (TARGET.HasFileTransfer))', A80),
    (None, "(HAS_SINGULARITY is true) && (TARGET.Disk >= RequestDisk)", ANY_DEVICE),
    # both: each leaves what it leaves
    ('regexp("A100", DeviceName)', f'TARGET.GPUs_DeviceName =!= "{A40}"', A80),
    # a model the pool does not have: false for every name, so it cannot be told from a test false
    # for want of an attribute
    ('DeviceName == "NVIDIA H200"', None, ANY_DEVICE),
    # two tests that leave nothing between them
    (f'DeviceName == "{T4}"', f'TARGET.GPUs_DeviceName == "{A80}"', ANY_DEVICE),
])
def test_device_class_of(require_gpus, requirements, want):
    assert device_class_of(require_gpus, requirements, POOL) == want


@pytest.mark.parametrize(("require_gpus", "requirements", "want"), [
    # (A100 && Capability) || H100 is false only for the T4: A100 and H100 are left, so ANY (split at
    # the &&, its first part would have made it the A100 class)
    (f'DeviceName == "{A80}" && Capability >= 8.0 || DeviceName == "{T4}"', None, ANY_DEVICE),
    (f'DeviceName == "{A80}" || DeviceName == "{A40}" && Capability >= 9.0', None, ANY_DEVICE),
    (None, f'(TARGET.GPUs_DeviceName == "{T4}" && TARGET.HasScratch || TARGET.GPUs_DeviceName == "{A80}") '
           "&& (TARGET.Memory >= RequestMemory)", ANY_DEVICE),
    # an alternative that leaves one model: decided by the whole
    (f'DeviceName == "{T4}" || DeviceName == "NVIDIA H200"', None, T4),
    # each requirement reads the device under the names its ad has: a GPU's DeviceName for RequireGPUs,
    # the machine's GPUs_DeviceName / CUDADeviceName for Requirements
    (f'GPUs_DeviceName == "{T4}"', None, ANY_DEVICE),
    (None, f'TARGET.DeviceName == "{T4}"', ANY_DEVICE),
    (None, f'GPUs_DeviceName == "{T4}"', T4),
    # a guard against an empty name is no device test (the name no pool has is not empty)
    ('DeviceName != ""', None, ANY_DEVICE),
])
def test_alternatives_and_scopes(require_gpus, requirements, want):
    assert device_class_of(require_gpus, requirements, POOL) == want


def test_a_one_model_pool_and_no_pool():
    # a test of the only model is that model: the name no pool has tells it from no test at all
    assert device_class_of(f'DeviceName == "{T4}"', None, [T4]) == T4
    assert device_class_of("Capability >= 7.0", None, [T4]) == ANY_DEVICE
    assert device_class_of('DeviceName != ""', None, [T4]) == ANY_DEVICE
    assert device_class_of(f'DeviceName == "{T4}"', None, []) == ANY_DEVICE


def test_top_level_parts_keep_strings_and_parentheses_whole():
    assert _conjuncts('((A && "x)&&(") && (B)) && C && (D || E)') == ["A", '"x)&&("', "B", "C", "D || E"]
    # || binds looser than &&, and the conditional looser still: such a text is one part
    assert _conjuncts("A && B || C") == ["A && B || C"]
    assert _conjuncts("(A && B || C) && D") == ["A && B || C", "D"]
    assert _conjuncts("A ? B && C : D") == ["A ? B && C : D"]
    assert _conjuncts("(A) || (B && C)") == ["(A) || (B && C)"]
    assert _conjuncts("(A) && (B)") == ["A", "B"]
    assert _conjuncts("(A =?= B) && C") == ["A =?= B", "C"]  # not a conditional
    assert _conjuncts('"a\\"&&b" && C') == ['"a\\"&&b"', "C"]
    assert _conjuncts("(A && B") == ["(A && B"]  # unbalanced: one part


def test_a_string_with_the_separator_is_read_as_a_string():
    # the && inside the literal is not a separator: the part stays one test of the name
    assert device_class_of('DeviceName == "odd && name"', None, ["odd && name", T4]) == "odd && name"


def test_an_unreadable_expression_raises_a_clear_error():
    with pytest.raises(UnreadableExpression, match="DeviceName =="):
        device_class_of("DeviceName ==", None, POOL)
    with pytest.raises(UnreadableExpression):
        device_class_of(None, '((TARGET.GPUs_DeviceName == "Tesla T4"', POOL)
    # a text that names no device attribute cannot depend on the device: not read at all
    assert device_class_of('DeviceName == "Tesla T4"', "((", POOL) == T4
    assert device_class_of("Capability >=", None, POOL) == ANY_DEVICE


@pytest.mark.parametrize(("value", "want"), [
    ('/Expr(DeviceName == "X")/', 'DeviceName == "X"'),
    (' DeviceName == "X" ', 'DeviceName == "X"'),
    ("/Expr(undefined)/", None),
    ("", None),
    ("UNDEFINED", None),
    (None, None),
    (True, "true"),
    (False, "false"),
    (8, "8"),
])
def test_expression_text(value, want):
    assert expression_text(value) == want


def test_expression_text_refuses_a_structure():
    with pytest.raises(ValueError, match="dict"):
        expression_text({"a": 1})


def test_a_requirements_text_adstash_cut_is_read_by_its_complete_parts():
    """condor_adstash keeps a string's first 253 characters and "...": a GPU job's Requirements is
    often longer. Its device test near the start is read from the complete parts before the cut;
    the whole text no longer parses, and it was counted unreadable."""
    full = (f'(TARGET.GPUs_DeviceName == "{A80}") && (TARGET.Arch == "X86_64") && (TARGET.OpSys == "LINUX") && '
            "(TARGET.Disk >= RequestDisk) && (TARGET.Memory >= RequestMemory) && (TARGET.HasFileTransfer) && "
            "(TARGET.GPUs >= RequestGPUs) && (TARGET.Cpus >= RequestCpus) && (TARGET.HasSingularity is true)")
    assert len(full) > 256
    cut = full[:253] + "..."
    assert device_class_of(None, full, POOL) == device_class_of(None, cut, POOL) == A80
    # nothing complete before the cut, or an alternative at the top level: nothing to read, and no
    # error (the cut is not the job's)
    assert device_class_of(None, f'(TARGET.GPUs_DeviceName == "{T4}" && TARGET.Arch == "X...', POOL) == ANY_DEVICE
    assert device_class_of(None, f'TARGET.GPUs_DeviceName == "{T4}" || A && B && C...', POOL) == ANY_DEVICE
    # a cut Requirements not in condor_submit's form ("(the user's) && ..."): what follows may be an
    # alternative too
    assert device_class_of(None, f'TARGET.GPUs_DeviceName == "{T4}" && TARGET.Arch == "X86_64" && B...',
                           POOL) == ANY_DEVICE
    # a cut RequireGPUs is the user's own text: what follows the cut may be an alternative
    # (DeviceName == A80 && ... || DeviceName == T4), so its first parts say nothing
    assert device_class_of(f'DeviceName == "{A80}" && GlobalMemoryMb >= 40000 && ' + "x" * 240 + "...", None,
                           POOL) == ANY_DEVICE
