#pragma once
// BERT for pre-training (Hugging Face BertForPreTraining names), post-LN encoder layers.
//   inputs: input_ids [B, S] i64, token_type_ids [B, S] i64, attention_mask [B, 1, 1, S] f32 additive
//           (0 for tokens to attend to, -10000 for padding)
//   labels: mlm_labels [B, S] i64 (-100: not predicted), nsp_labels [B] i64 (only when config.nsp)
//   output: loss [] = MLM cross-entropy (+ NSP cross-entropy when config.nsp)
// With config.task == "classification" (BertForSequenceClassification names): no MLM or NSP head;
//   labels: labels [B] i64 in [0, classes); the pooled [CLS] (bert.pooler) -> dropout -> classifier
//   (linear, hidden -> classes) -> loss [] = cross-entropy.
#include "graph/graph.h"
#include "io/config.h"

namespace partrain {

/// Builds BertForPreTraining's (or BertForSequenceClassification's) forward graph (see the header comment). Position ids 0..S-1 are a
/// Const. Attention is composed (MatMul scaled by 1/√d, Softmax with the mask, Dropout, MatMul) unless
/// config.fused_attention. The MLM decoder is tied to bert.embeddings.word_embeddings.weight.
Graph build_bert(const ModelConfig& config);

/// The masked-language-model loss task of build_bert: only the masked positions of its labels count
/// (about [data] mask_probability of the tokens); the others are -100, which the loss kernels skip.
inline constexpr const char* kBertMaskedLanguageModelLoss = "cls.predictions.loss";

}  // namespace partrain
