#!/usr/bin/env python3
"""The generated image set (make_images) stands in for CIFAR-10 in every test, so its classes must
be learnable: one short run of exercise 02's solution (1 rank, 50 steps of 32 images, the small
default ResNet) must bring the test loss well below log(10) = 2.303, the loss of a guess among 10
classes, and the accuracy well above 1 in 10. A generator whose labels did not follow the
pictures would leave both at chance.

usage: images_learnable.py TRAINER DATA_DIR WORK_DIR
"""
import math
import re
import subprocess
import sys

trainer, data, work = sys.argv[1:4]
p = subprocess.run([trainer, "--data-dir", data, "--out-dir", work, "--epochs", "1",
                    "--train-images", "1600", "--test-images", "500", "--seed", "5"],
                   capture_output=True, text=True, timeout=120)
out = p.stdout + p.stderr
m = re.search(r"^final test loss ([0-9.]+), test accuracy ([0-9.]+)$", out, re.M)
if p.returncode != 0 or not m:
    sys.exit(f"FAIL: the run did not finish (exit {p.returncode}):\n{out}")
loss, accuracy = float(m.group(1)), float(m.group(2))
print(f"after 50 steps: test loss {loss:.4f} (chance: {math.log(10):.4f}), accuracy {accuracy:.3f}")
if loss > 0.5 * math.log(10) or accuracy < 0.5:
    sys.exit("FAIL: the generated classes are not learned in a short run: the loss must be below "
             f"{0.5 * math.log(10):.3f} and the accuracy above 0.5")
print("ok: the generated image set is learnable")
