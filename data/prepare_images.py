#!/usr/bin/python3
"""Builds fashion_mnist.h5 from the IDX files of Debian's dataset-fashion-mnist package.

  /train/images uint8 [60000,28,28]   /train/labels uint8 [60000]
  /test/images  uint8 [10000,28,28]   /test/labels  uint8 [10000]
  attributes on "/": format, source, mean (0.2860), std (0.3530), classes (comma-separated names)

Run by data/prepare.sh with the system interpreter (python3-h5py, python3-numpy).
"""
import argparse
import gzip
import os
import struct
import sys

import h5py
import numpy as np

SOURCE_DIR = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
           "Ankle boot"]


def read_idx(path):
    """Decodes a gzip-compressed IDX file (magic 0x0801 labels, 0x0803 images) into a uint8 array."""
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    zero, dtype_code, rank = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank)
    if array.size != int(np.prod(dims)):
        raise ValueError(f"{path}: expected {np.prod(dims)} bytes of data, found {array.size}")
    return array.reshape(dims)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--source-dir", default=SOURCE_DIR)
    parser.add_argument("--images", type=int, default=0,
                        help="keep the first N training images and N/6 test images (0: all; a small file to carry)")
    arguments = parser.parse_args()
    if arguments.images < 0:
        parser.error("--images must be >= 0")
    os.makedirs(arguments.output_dir, exist_ok=True)
    path = os.path.join(arguments.output_dir, "fashion_mnist.h5")
    with h5py.File(path, "w") as output:
        for split, prefix in [("train", "train"), ("test", "t10k")]:
            images = read_idx(os.path.join(arguments.source_dir, f"{prefix}-images-idx3-ubyte.gz"))
            labels = read_idx(os.path.join(arguments.source_dir, f"{prefix}-labels-idx1-ubyte.gz"))
            if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
                raise ValueError(f"{split}: unexpected shapes {images.shape}, {labels.shape}")
            if arguments.images:
                keep = arguments.images if split == "train" else max(1, arguments.images // 6)
                images, labels = images[:keep], labels[:keep]
            output.create_dataset(f"{split}/images", data=images, compression="gzip", compression_opts=4,
                                  chunks=(min(1000, images.shape[0]), 28, 28))
            output.create_dataset(f"{split}/labels", data=labels)
            print(f"prepare_images: {split}: {images.shape[0]} images, mean {images.mean() / 255:.4f}")
        output.attrs["format"] = "partrain-images-1"
        output.attrs["source"] = "Fashion-MNIST (Debian dataset-fashion-mnist)"
        output.attrs["mean"] = 0.2860
        output.attrs["std"] = 0.3530
        output.attrs["classes"] = ",".join(CLASSES)
    print(f"prepare_images: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
