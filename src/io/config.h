#pragma once
// Experiment files (TOML, read with toml++). A file is loaded into a ConfigDocument, `--set
// section.key=value` overrides are applied on top, and each section is then read into a typed
// struct through a SectionReader, which rejects unknown keys and wrong types with a partrain::Error
// naming the file, line and key ("configs/x.toml:7: [model] key 'hiden' is unknown").
//
// Adding a section (e.g. [train]): declare a struct with its defaults, write a read_train_config()
// that calls SectionReader::read() for each key and then finish(), and add the struct to
// ExperimentConfig (load_experiment reads it). Sections listed in known_config_sections() but not
// read yet are accepted and ignored.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace partrain {

/// An experiment file parsed into memory with its `--set` overrides applied. Copies share the data.
class ConfigDocument {
 public:
  /// Reads and parses a TOML file, then applies the overrides in order. Throws partrain::Error on
  /// an unreadable file ("path: cannot read"), a TOML syntax error ("path:line:column: ...") or a
  /// malformed override.
  static ConfigDocument load(const std::string& path, std::span<const std::string> overrides = {});
  /// Parses TOML text; `source_name` stands for the file name in error messages.
  static ConfigDocument parse(std::string_view text, const std::string& source_name,
                              std::span<const std::string> overrides = {});

  /// Applies one override "section.key=value" (further dots name nested tables). The value is
  /// parsed as a TOML value (number, bool, quoted string, array, ...); text that is not valid TOML
  /// is taken as a bare string (`--set model.type=gpt`). Throws partrain::Error when the text has
  /// no '=' or no section, or when a path component is not a table.
  void apply_override(const std::string& override_text);

  /// The file name given to load()/parse().
  const std::string& source_name() const;
  /// Top-level section names present in the document, in file order.
  std::vector<std::string> section_names() const;
  /// Throws partrain::Error naming the file and line of the first top-level entry that is not a
  /// table or whose name is not in `known_sections`.
  void check_sections(std::span<const std::string_view> known_sections) const;

  struct Data;  // the toml++ table (kept out of this header to keep compile times low)
  const Data& data() const { return *data_; }

 private:
  std::shared_ptr<Data> data_;
};

/// Reads the typed keys of one [section]. Each read() leaves the value untouched when the key is
/// absent (so the caller's default stays), and throws partrain::Error naming file, line, section
/// and key when the value has the wrong type. finish() rejects keys that no read() asked for.
class SectionReader {
 public:
  SectionReader(const ConfigDocument& document, std::string section);

  /// True when the section exists in the document.
  bool present() const;
  /// True when the key exists in the section.
  bool has(std::string_view key) const;
  void read(std::string_view key, std::int64_t& value);
  /// Accepts an integer or a floating-point TOML value.
  void read(std::string_view key, double& value);
  void read(std::string_view key, bool& value);
  void read(std::string_view key, std::string& value);
  /// Reads a string that must be one of `choices`.
  void read_choice(std::string_view key, std::string& value, std::initializer_list<std::string_view> choices);
  /// Reads an array of integers / of strings (every element must have that type).
  void read(std::string_view key, std::vector<std::int64_t>& value);
  void read(std::string_view key, std::vector<std::string>& value);
  /// Reads a memory size given as a string ("16GiB", see core/units.h) or a number of bytes.
  void read_memory_size(std::string_view key, double& bytes);
  /// Reads a boolean, or the string "auto" (then `automatic` is set and `value` left alone).
  void read_bool_or_auto(std::string_view key, bool& value, bool& automatic);
  /// Reads an integer, or the string "auto" as `auto_value` (another string is an error). The
  /// integer `auto_value` itself is an error naming `accepted` (the documented values): it is the
  /// internal code for "auto", not a value a file may give.
  void read_integer_or_auto(std::string_view key, std::int64_t& value, std::int64_t auto_value,
                            std::string_view accepted);
  /// Throws partrain::Error "file:line: [section] key 'key' <message>" (the section's line when
  /// the key is absent).
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;
  /// Throws partrain::Error for the first key of the section that no read() asked for.
  void finish() const;

 private:
  const ConfigDocument& document_;
  std::string section_;
  std::vector<std::string> read_keys_;
};

/// The [model] section: what to build (models/model.h). Keys that do not apply to `type` keep
/// their defaults and are ignored by the builder.
struct ModelConfig {
  std::string type;                 // "bert", "gpt" or "resnet" (required)
  // ---- transformers (bert, gpt) ----
  std::int64_t layers = 12;         // encoder layers / decoder blocks
  std::int64_t hidden = 768;        // hidden size
  std::int64_t heads = 12;          // attention heads (divides hidden)
  std::int64_t intermediate = 0;    // MLP inner size; 0: 4 * hidden
  std::int64_t vocab = 30522;       // vocabulary size (bert default; gpt: 50257)
  std::int64_t vocab_divisible_by = 128;  // tensor parallelism t > 1 pads the vocabulary to a multiple of
                                          // this × t (Megatron-LM's --make-vocab-size-divisible-by)
  std::int64_t max_position = 512;  // rows of the position embedding (gpt default: 1024)
  std::int64_t type_vocab = 2;      // bert token-type (segment) vocabulary
  std::int64_t seq_len = 128;       // sequence length of a sample (<= max_position; gpt default: 1024)
  double dropout = 0.1;             // hidden/embedding dropout probability
  double attention_dropout = -1;    // attention-probability dropout; < 0: same as dropout
  double layer_norm_eps = -1;       // < 0: 1e-12 for bert, 1e-5 for gpt
  double initializer_range = 0.02;  // std of the normal init of linear and embedding weights
  bool nsp = true;                  // bert: pooler + next-sentence-prediction head and loss
  std::string task = "pretraining"; // bert: "pretraining" (MLM + NSP heads) or "classification" (the
                                    // pooled [CLS] -> dropout -> linear to `classes`, cross-entropy:
                                    // BertForSequenceClassification)
  bool fused_attention = false;     // one Attention task instead of MatMul/Scale/Softmax/Dropout/MatMul
                                    // (the fused op has no attention dropout)
  // The special token ids of the tokenizer the embeddings were trained with: the [model] keys
  // pad_id, unk_id, bos_id, eos_id, cls_id, sep_id, mask_id that the file sets (a published model's,
  // written by validation/import_hf.py), in that order; -1: that tokenizer has no such token. Keys
  // not set are not checked. When any is set, the data (text.h5) must hold exactly these ids and
  // exactly `vocab` tokens (io/batch_source.h).
  std::vector<std::pair<std::string, std::int64_t>> special_token_ids;
  // ---- resnet ----
  std::int64_t depth = 50;          // 18, 34 (basic blocks), 50, 101, 152 (bottleneck blocks)
  std::int64_t width_factor = 1;    // BiT-style multiplier of every channel width (RaNNC's ResNet152x8: 8)
  std::int64_t base_width = 64;     // channels of the stem and of layer1 before the width factor
  std::int64_t classes = 1000;      // classifier outputs (resnet; bert with task = "classification")
  std::int64_t image_size = 224;    // input height = width
  std::int64_t channels = 3;        // input channels

  /// True for models whose loss is one classification over `classes` (ResNet, BERT's
  /// sequence classification): evaluation reports top-1 accuracy.
  bool is_classifier() const { return type == "resnet" || (type == "bert" && task == "classification"); }
  /// The MLP inner size (intermediate, or 4 * hidden when 0).
  std::int64_t intermediate_size() const { return intermediate > 0 ? intermediate : 4 * hidden; }
  /// The attention dropout probability (attention_dropout, or dropout when negative).
  double attention_dropout_probability() const { return attention_dropout >= 0 ? attention_dropout : dropout; }
  /// The LayerNorm epsilon (layer_norm_eps, or the type's default when negative).
  double layer_norm_epsilon() const { return layer_norm_eps >= 0 ? layer_norm_eps : (type == "gpt" ? 1e-5 : 1e-12); }
};

/// Reads and validates [model] (type defaults first, then the keys). Throws partrain::Error naming
/// file, line and key for a missing section or type, unknown keys, wrong types and invalid values
/// (heads not dividing hidden, seq_len > max_position, unsupported depth, probabilities outside [0, 1)).
ModelConfig read_model_config(const ConfigDocument& document);

/// The [train] section: the optimisation problem (steps, batch, optimizer, learning-rate schedule).
struct TrainConfig {
  std::int64_t steps = 10;               // optimizer steps
  std::int64_t global_batch = 8;         // samples per step over all pipeline replicas
  std::int64_t microbatches = 0;         // microbatches per step and pipeline replica; 0: the plan's choice
  std::int64_t seed = 1234;              // parameters, dropout and data order
  std::string optimizer = "adamw";       // "adamw" or "sgd" (with momentum)
  double lr = 1e-3;                      // peak learning rate
  double min_lr = 0.0;                   // learning rate at the end of the decay
  std::int64_t warmup_steps = 0;         // linear warm-up from 0 to lr
  std::string lr_schedule = "cosine";    // decay after warm-up: "cosine", "linear" or "constant"
  double weight_decay = 0.01;            // decoupled (AdamW) / L2 added to the gradient (SGD)
  double beta1 = 0.9;                    // AdamW
  double beta2 = 0.999;                  // AdamW
  double eps = 1e-8;                     // AdamW
  double momentum = 0.9;                 // SGD
  double grad_clip = 1.0;                // global-norm clipping threshold; 0: off
  std::int64_t eval_every = 0;           // evaluate on held-out data every N steps; 0: never
  std::int64_t eval_batches = 1;         // global batches per evaluation
  std::string precision = "fp32";        // "fp32", "bf16" or "fp16" (mixed precision: 16-bit compute, fp32 master weights;
                                         // fp16 with dynamic loss scaling)
  // fp16's dynamic loss scaling (runtime/loss_scaler.h; PyTorch GradScaler's defaults).
  double initial_loss_scale = 65536.0;   // the first step's scale, 2^16
  double loss_scale_growth_factor = 2.0;  // > 1: the scale's growth after loss_scale_growth_interval good steps
  double loss_scale_backoff_factor = 0.5; // in (0, 1): the scale's factor after an overflow
  std::int64_t loss_scale_growth_interval = 2000;  // consecutive steps without overflow before it grows
  double min_loss_scale = 0.0;            // floor of the back-off; 0: none
  std::string device = "auto";           // "auto" (a GPU when one is visible), "cpu" or "cuda"
};

/// The [parallel] section: how the model is split over the devices (docs/configuration.md §[parallel]).
struct ParallelConfig {
  std::string planner = "rannc";         // rannc, ideals, dpl, ip, capslog, merak, uniform, manual
  std::int64_t world_size = 0;           // devices to plan for; 0: the MPI world size (plan: 1)
  double device_memory_bytes = 16.0 * (1ull << 30);  // memory per device
  double memory_margin = 0.1;            // fraction of device memory kept free
  std::int64_t devices_per_node = 8;     // devices sharing a node (fast link)
  std::string schedule = "1f1b";         // gpipe, 1f1b, scp, interleaved, zb_h1, zb_v or auto (1f1b or zb_h1, the faster)
  std::int64_t virtual_stages = 1;       // interleaved: model chunks per pipeline rank (Megatron's v; 1: 1f1b);
                                         // 0 ("auto"): the uniform planner chooses v by predicted step time
  std::string recompute = "auto";        // auto (the planner chooses per stage), none, boundaries, stage_aware,
                                         // layers, selective
  std::int64_t recompute_layers = 1;     // layers: transformer layers per checkpointed block (Megatron's
                                         // --recompute-num-layers)
  std::int64_t blocks = 32;              // RaNNC block count k
  std::int64_t max_microbatches = 64;    // RaNNC Algorithm 2 doubles the microbatch count up to this
  std::int64_t max_ideals = 200000;      // ideals planner: cap on enumerated ideals
  double ip_time_limit = 60.0;           // ip planner: seconds of MIP search per device count tried
  double ip_gap = 1e-4;                  // ip planner: relative optimality gap to stop at
  bool ip_contiguous = true;             // ip planner: contiguous splits (training needs them: false is an error)
  std::int64_t stages = 0;               // uniform / merak / manual: stage count; 0: the planner's choice
  std::int64_t tensor_parallel = 1;      // ranks of a tensor-parallel group inside each stage replica (Megatron's t);
                                         // 0 ("auto"): the planner chooses among 1, 2, 4, 8 (≤ devices_per_node)
  bool sub_pipelined_tmp = false;        // Merak's sub-pipelined TMP: two sub-microbatches overlap their TP all-reduces
  bool sequence_parallel = false;        // Korthikanti et al. 2022 §4.2.2: LayerNorm, dropout, residual stream split
                                         // along the sequence over the tensor-parallel group (needs tensor_parallel > 1)
  bool choose_sequence_parallel = false; // sequence_parallel = "auto": the planner tries both for every t > 1
  double bucket_mb = 25.0;                // gradient all-reduce bucket size limit, MiB (PyTorch DDP's bucket_cap_mb)
  std::int64_t zero = 0;                 // ZeRO stage: 0, or 1 (optimizer state sharded over each stage's data-parallel group)
                                         // -1 ("auto"): the planner chooses
  bool tensor_parallel_given = false;    // the file (or --set) sets tensor_parallel
  bool zero_given = false;               // the file (or --set) sets zero
  bool device_memory_given = false;      // the file, --set or a device_model sets device_memory (else a
                                         // GPU run plans with its GPU's own memory)
  bool blocks_given = false;             // the file (or --set) sets blocks (then no block refinement)
  std::vector<std::int64_t> replicas;    // manual: replicas per stage (sum = devices per pipeline replica)
  std::vector<std::string> boundaries;   // manual: first layer of stages 2..S (names as in `inspect`, e.g. "encoder.layer.1")
  /// A GPU preset (io/device_presets.h: "a100-80gb", "h100-sxm"): the analytic cost model prices
  /// kernels by their shapes on it, and its figures are the defaults of the device keys below and
  /// of device_memory and devices_per_node. "": the FLOP-only model at device_flops × device_efficiency.
  std::string device_model;
  double device_flops = 1e12;            // analytic cost model: FLOP/s of one device (peak when device_efficiency < 1)
  double device_efficiency = 1.0;        // analytic cost model: share of device_flops sustained, (0, 1]
  double link_latency = 0.0;             // seconds each collective on the node link starts with (analytic model)
  double link_bandwidth = 100e9;         // bytes/s between devices of a node
  double network_bandwidth = 12.5e9;     // bytes/s between nodes
};

/// The [data] section: where samples come from (data/prepare.sh writes both files).
struct DataConfig {
  std::string path;                      // "": data/prepared/text.h5 (bert, gpt) or data/prepared/fashion_mnist.h5
  double mask_probability = 0.15;        // bert: share of tokens selected for MLM
  bool synthetic = false;                // resnet: random images and labels, no file (benchmarks, as
                                         // Megatron-LM's --mock-data); io/batch_source.h
};

/// The [log] section: where a run's outputs go.
struct LogConfig {
  std::string dir;                       // output directory; "": runs/<config file stem>
  std::int64_t every = 1;                // a log line every N steps (metrics.jsonl gets every step)
  std::string trace;                     // Chrome-trace JSON file name in dir ("trace.json"); "": none
  bool save_parameters = false;          // write the final parameters and buffers to dir/parameters.h5
  bool save_initial = false;             // write the initial parameters, buffers and every step's global
                                         // batch to dir/initial_parameters.h5 (golden files, validation/golden)
  bool save_gradients = false;           // write the first step's gradients (reduced, before clipping)
                                         // to dir/gradients.h5
  bool op_profile = false;               // time every kernel call; the run summary lists seconds per op
                                         // type, forward and backward apart, for each stage
};

/// The [profile] section: measuring stage costs on the real devices before planning.
struct ProfileConfig {
  bool enabled = true;                   // false: plan on the analytic cost model
  std::string cache_dir = "runs/profile-cache";  // ProfileDB files, keyed by graph hash, backend and dtype
  std::int64_t warmup = 1;               // untimed passes per measurement
  std::int64_t repeats = 3;              // timed passes per measurement (median)
  bool flush_caches = true;              // flush the device's caches before each timed pass (ProfilerOptions)
  bool refresh = false;                  // true: measure again even when the cache holds the layers
  double replan_threshold = 0.15;        // |step-time error| that corrects the profile and plans again; 0: never
  std::int64_t replan_window = 3;        // steps measured (after one warm-up step) before comparing
};

/// The [checkpoint] section: parallel-HDF5 checkpoints of parameters, optimizer state and progress.
struct CheckpointConfig {
  std::string dir;                       // "": <[log] dir>/checkpoints
  std::int64_t every = 0;                // write every N steps (and after the last step); 0: never
  std::int64_t keep = 3;                 // newest checkpoints kept
  std::string resume;                    // "", "latest", "auto" or a path (--resume overrides)
  std::string on_error = "stop";         // a failed checkpoint write: "stop" (exit 1) or "continue" (warn)
  double write_timeout = 600;            // seconds one collective step of a checkpoint write may take
};

/// Reads [train] and [parallel]; throws partrain::Error naming file, line and key on bad values.
TrainConfig read_train_config(const ConfigDocument& document);
ParallelConfig read_parallel_config(const ConfigDocument& document);
/// Reads [data]; a relative path is taken relative to the current directory.
DataConfig read_data_config(const ConfigDocument& document);
LogConfig read_log_config(const ConfigDocument& document);
ProfileConfig read_profile_config(const ConfigDocument& document);
CheckpointConfig read_checkpoint_config(const ConfigDocument& document);

/// Names of the top-level sections an experiment file may hold: model, train, parallel, data,
/// profile, log, checkpoint.
std::span<const std::string_view> known_config_sections();

/// Everything read from an experiment file. Sections that are not read yet are only checked to be
/// known section names.
struct ExperimentConfig {
  std::string path;
  std::string text;            // the file's TOML text with overrides applied (saved in checkpoints)
  ModelConfig model;
  TrainConfig train;
  ParallelConfig parallel;
  DataConfig data;
  LogConfig log;
  ProfileConfig profile;
  CheckpointConfig checkpoint;
};

/// Loads an experiment file with overrides and reads every section. Throws partrain::Error.
ExperimentConfig load_experiment(const std::string& path, std::span<const std::string> overrides = {});

}  // namespace partrain
