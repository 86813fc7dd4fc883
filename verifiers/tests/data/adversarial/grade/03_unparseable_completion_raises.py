# technique: a completion that makes the grader raise (an exception must be an error, not a score)
def grade(sample, item):
    return 1.0 if float(sample["output_text"]) == float(item["answer"]) else 0.0
# ---- completion
forty-two, trust me
