# honest: a numeric grader that prints while grading, and a correct completion
import re
def grade(sample, item):
    print("grading", sample["output_text"])
    numbers = re.findall(r"-?\d+", sample["output_text"])
    return 1 if numbers and numbers[-1] == item["answer"] else 0
# ---- completion
The answer is 42
