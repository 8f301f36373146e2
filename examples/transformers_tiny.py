"""Ray Train's Hugging Face Transformers guide with the imports changed, offline.

Ray's guide fine-tunes ``bert-base-cased`` on Yelp reviews, downloaded from the
Hub. This is the same script with nothing to download: a tiny BERT built from
a config (randomly initialised) reads scikit-learn's digits as sequences of 64
pixel "tokens" and learns to classify them, with ``transformers.Trainer`` on 2
workers, a checkpoint every epoch and resume after a failure.

    HF_HUB_OFFLINE=1 python examples/transformers_tiny.py --num-workers 2 --epochs 3
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import elastic_train
import elastic_train.huggingface.transformers
from elastic_train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from elastic_train.torch import TorchTrainer


def digits_as_tokens() -> tuple[list[dict], list[dict]]:
    """Each 8x8 digit as a [CLS] token followed by its 64 pixel values (0..16), with
    its label (BERT classifies from the first position)."""
    digits = load_digits()
    pixels = torch.tensor(digits.data, dtype=torch.long)
    tokens = torch.cat([torch.full((len(pixels), 1), CLS), pixels], dim=1)
    labels = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_val, y_train, y_val = train_test_split(tokens, labels, test_size=0.2,
                                                      random_state=0, stratify=labels)

    def rows(x: torch.Tensor, y: torch.Tensor) -> list[dict]:
        return [{"input_ids": xi, "attention_mask": torch.ones_like(xi), "labels": yi}
                for xi, yi in zip(x, y, strict=True)]

    return rows(x_train, y_train), rows(x_val, y_val)


CLS = 17


def tiny_bert() -> BertForSequenceClassification:
    config = BertConfig(vocab_size=CLS + 1, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128,
                        max_position_embeddings=65, num_labels=10,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def compute_metrics(eval_pred) -> dict[str, float]:
    # Ray's guide uses evaluate.load("accuracy"), which downloads the metric.
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


# [1] Encapsulate data preprocessing, training, and evaluation logic in a training function
def train_func(config: dict) -> None:
    train_set, eval_set = digits_as_tokens()
    model = tiny_bert()
    run_name = elastic_train.get_context().get_experiment_name()
    training_args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "elastic_train_hf", run_name),
        eval_strategy="epoch", save_strategy="epoch", logging_strategy="epoch",
        num_train_epochs=config["epochs"], learning_rate=config.get("lr", 1e-3),
        per_device_train_batch_size=16, per_device_eval_batch_size=128,
        report_to="none", disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set,
                      eval_dataset=eval_set, compute_metrics=compute_metrics)

    # [2] Report metrics and checkpoints to elastic-train
    trainer.add_callback(elastic_train.huggingface.transformers.RayTrainReportCallback())
    for callback in config.get("callbacks", []):
        trainer.add_callback(callback)

    # [3] Prepare the Transformers Trainer
    trainer = elastic_train.huggingface.transformers.prepare_trainer(trainer)

    # Start training, or resume after a failure from the latest checkpoint
    checkpoint = elastic_train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            name = elastic_train.huggingface.transformers.RayTrainReportCallback.CHECKPOINT_NAME
            trainer.train(resume_from_checkpoint=os.path.join(d, name))
    else:
        trainer.train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--storage-path", default=None)
    parser.add_argument("--name", default="transformers_tiny")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here comes from the Hub

    # [4] Define a TorchTrainer to launch train_func on all workers
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "lr": 1e-3},
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(
            name=args.name, storage_path=args.storage_path, start_over=True,
            failure_config=FailureConfig(max_failures=2),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    result = trainer.fit()
    print(f"eval_accuracy {result.metrics['eval_accuracy']:.3f} after "
          f"{result.metrics['epoch']:.0f} epochs; checkpoint {result.checkpoint.path}")


if __name__ == "__main__":
    main()
