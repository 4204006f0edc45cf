"""benchmarks.studies.hbm_breakdown on a hand-written TPU program text: tiled bytes, what each op
moves, its estimated cycles and its kind (the bytes below are worked out by hand)."""

# ruff: noqa: E501  (HLO lines are as long as the compiler writes them)

from benchmarks.studies import hbm_breakdown as hb

HLO = """\
HloModule jit_train_step, is_scheduled=true

%fused_dot (p0: bf16[8,256], p1: bf16[256,64]) -> f32[8,64] {
  %p0 = bf16[8,256]{1,0:T(8,128)(2,1)} parameter(0)
  %p1 = bf16[256,64]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %convolution.1 = f32[8,64]{1,0:T(8,128)} convolution(%p0, %p1), dim_labels=bf_io->bf, metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/intermediate/dot_general"}
}

%fused_softmax (p0: f32[2,12,8,8]) -> f32[2,12,8,8] {
  %p0 = f32[2,12,8,8]{3,2,1,0:T(8,128)} parameter(0)
  ROOT %exponential.1 = f32[2,12,8,8]{3,2,1,0:T(8,128)} exponential(%p0), metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/attention/attention._attend/exp"}
}

%fused_update (p0: f32[64], p1: f32[64]) -> f32[64] {
  %p0 = f32[64]{0:T(128)} parameter(0)
  %p1 = f32[64]{0:T(128)} parameter(1)
  ROOT %subtract.1 = f32[64]{0:T(128)} subtract(%p0, %p1), metadata={op_name="jit(train_step)/sub"}
}

ENTRY %main (param.1: bf16[8,256], param.2: bf16[256,64], param.3: f32[2,12,8,8], param.4: f32[64]) -> f32[8,64] {
  %param.1 = bf16[8,256]{1,0:T(8,128)(2,1)} parameter(0)
  %param.2 = bf16[256,64]{1,0:T(8,128)(2,1)} parameter(1)
  %param.3 = f32[2,12,8,8]{3,2,1,0:T(8,128)} parameter(2)
  %param.4 = f32[64]{0:T(128)} parameter(3), metadata={op_name="state.params[\\'w\\']"}
  %matmul = f32[8,64]{1,0:T(8,128)} fusion(%param.1, %param.2), kind=kOutput, calls=%fused_dot, backend_config={"estimated_cycles":"1000"}
  %softmax = f32[2,12,8,8]{3,2,1,0:T(8,128)} fusion(%param.3), kind=kLoop, calls=%fused_softmax, backend_config={"estimated_cycles":"300"}
  %all-reduce.1 = f32[64]{0:T(128)} all-reduce(%param.4), replica_groups={}, to_apply=%fused_update
  %update = f32[64]{0:T(128)} fusion(%param.4, %all-reduce.1), kind=kLoop, calls=%fused_update
  %copy-start.1 = (f32[8,64]{1,0:T(8,128)S(3)}, f32[8,64]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%matmul)
  %copy-done.1 = f32[8,64]{1,0:T(8,128)} copy-done(%copy-start.1)
  ROOT %t = (f32[8,64]{1,0:T(8,128)}) tuple(%copy-done.1)
}
"""


def test_arrays_are_counted_in_whole_tiles():
    assert hb.array_bytes("f32[8,64]{1,0:T(8,128)}") == 8 * 128 * 4  # 64 fills a 128 tile
    assert hb.array_bytes("f32[8,64]{1,0:T(8,128)}", tiled=False) == 8 * 64 * 4
    assert hb.array_bytes("bf16[8,256]{1,0:T(8,128)(2,1)}") == 16 * 256 * 2  # 16-row tiles
    assert hb.array_bytes("f32[64]{0:T(128)}") == 128 * 4
    assert hb.array_bytes("f32[2,12,8,8]{3,2,1,0:T(8,128)}") == 2 * 12 * 8 * 128 * 4
    assert hb.array_bytes("(f32[64]{0:T(128)}, u32[]{:S(2)})") == 128 * 4 + 4


def test_each_top_level_op_gets_its_bytes_cycles_and_kind():
    costs = {c.name: c for c in hb.op_costs(HLO)}
    assert set(costs) == {"matmul", "softmax", "all-reduce.1", "update", "copy-start.1"}
    matmul = costs["matmul"]
    assert matmul.kind == "matmuls" and matmul.cycles == 1000
    assert matmul.bytes == 16 * 256 * 2 + 256 * 128 * 2 + 8 * 128 * 4  # two inputs, one output
    softmax = costs["softmax"]
    assert softmax.kind == "attention scores/softmax" and softmax.cycles == 300
    assert softmax.bytes == 2 * (2 * 12 * 8 * 128 * 4)
    assert costs["all-reduce.1"].kind == "collectives"
    assert costs["update"].kind == "optimizer update" and costs["update"].bytes == 3 * 128 * 4
    copy = costs["copy-start.1"]
    assert copy.kind == "copies/transposes" and copy.bytes == 2 * 8 * 128 * 4  # read + write
    table = hb.table(list(costs.values()), program_bytes=2 * sum(c.bytes for c in costs.values()))
    assert "| matmuls |" in table and "(the ops' sum is 50.0% of it)" in table


# A Pallas kernel as the TPU compiler prints it: its frontend attributes' metadata holds a
# newline and a continuation line opening with "}}" (splash attention's kernels do).
KERNEL = """\
  %kernel.1 = bf16[2,64,128]{2,1,0:T(8,128)(2,1)} custom-call(%param.5), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 128}"
}}, metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/attention/attention._attend/shard_map/pallas_call"}
  %after = bf16[2,128,64]{2,1,0:T(8,128)(2,1)} copy(%kernel.1)
"""


def test_a_kernel_whose_config_spans_lines_ends_no_computation():
    """Before the continuation lines were joined, the "}}" line closed the entry computation
    and every op after the first kernel went uncounted (9% of a splash step's bytes)."""
    entry = HLO.replace(
        "  %param.4 = f32[64]",
        "  %param.5 = bf16[2,128,64]{2,1,0:T(8,128)(2,1)} parameter(4)\n"
        + KERNEL
        + "  %param.4 = f32[64]",
    )
    costs = {c.name: c for c in hb.op_costs(entry)}
    assert {"kernel.1", "after", "update", "copy-start.1"} <= set(costs)
    kernel = costs["kernel.1"]
    assert kernel.kind == "attention scores/softmax"
    # Operand (2, 128, 64): its 64-wide rows fill 128-lane tiles; the (2, 64, 128) result does not.
    assert kernel.bytes == 2 * 128 * 128 * 2 + 2 * 64 * 128 * 2
    assert kernel.unpadded == 2 * (2 * 128 * 64 * 2)
    assert costs["after"].bytes == kernel.bytes  # the same two arrays, the other way round
    assert "| attention scores/softmax | 0.0 | 0.0 | 1.50x |" in hb.padding_table([kernel])
