# honest: an exact-match grader and a correct completion
def grade(sample, item):
    return 1.0 if sample["output_text"].strip() == item["answer"] else 0.0
# ---- completion
42
