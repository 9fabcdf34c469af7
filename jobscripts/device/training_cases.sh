# The training checks of the GPU device command (issue 23 item 3d), sourced by jobscripts/device-pack.sh
# (which computes the CPU reference losses here, on the build machine) and jobscripts/device-checks.sh
# (which trains the same cases on the GPU there and compares). One definition, so both sides run the
# same settings.
#
# training_arguments MODEL PRECISION DEVICE LOG_DIR DATA_DIR [extra --set ...]
#   prints the `partrain train` arguments of MODEL-tiny (bert, gpt, resnet) trained for
#   TRAINING_STEPS steps (20) on one rank, one stage, two microbatches, on DEVICE (cpu or cuda) in
#   PRECISION (fp32 or bf16), without profiling, planning searches, evaluation or checkpoints.
#   ResNet as in the distributed validation: SGD at a small learning rate on 16 images per step
#   (BatchNorm over small groups is chaotic under AdamW).
TRAINING_STEPS=${TRAINING_STEPS:-20}
TRAINING_MODELS=${TRAINING_MODELS:-"bert gpt resnet"}
TRAINING_PRECISIONS=${TRAINING_PRECISIONS:-"fp32 bf16"}

training_arguments() {
  local model=$1 precision=$2 device=$3 log_dir=$4 data_dir=$5
  shift 5
  local data=$data_dir/text.h5
  [ "$model" = resnet ] && data=$data_dir/fashion_mnist.h5
  local -a arguments=(train "configs/$model-tiny.toml"
    --set "train.steps=$TRAINING_STEPS" --set "train.device=$device" --set "train.precision=$precision"
    --set "log.dir=$log_dir" --set "data.path=$data" --set checkpoint.every=0 --set profile.enabled=false
    --set parallel.planner=uniform --set parallel.stages=1 --set train.microbatches=2
    --set parallel.recompute=none --set train.eval_every=0 --set log.trace=)
  if [ "$model" = resnet ]; then
    arguments+=(--set model.base_width=8 --set train.optimizer=sgd --set train.lr=0.002 --set train.global_batch=16)
  fi
  arguments+=("$@")
  printf '%s\n' "${arguments[@]}"
}
