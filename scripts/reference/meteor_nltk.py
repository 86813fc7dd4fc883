"""Reference METEOR values for verifiers/src/graders/meteor.rs (run once, by hand; no test needs it).

    python3 -m venv /tmp/nltk && /tmp/nltk/bin/pip install nltk==3.10.4
    /tmp/nltk/bin/python scripts/reference/meteor_nltk.py

NLTK's defaults (alpha=0.9, beta=3, gamma=0.5, PorterStemmer) with WordNet matching disabled: the
`wordnet` argument is an object whose synsets() is empty, so only exact and stem matches count,
as in Verity. Each pair is also scored with the Snowball English stemmer (Verity's, Porter2):
only pairs where both stemmers give the same score are printed, so the numbers test the
alignment, not the difference between the two stemmers.
"""

from nltk.stem.porter import PorterStemmer
from nltk.stem.snowball import SnowballStemmer
from nltk.translate.meteor_score import meteor_score


class NoSynonyms:
    def synsets(self, word):
        return []


PAIRS = [
    ("the cat sat on the mat", "the cat is sitting on the mat"),
    ("it is a guide to action which ensures that the military always obeys the commands of the party",
     "it is a guide to action that ensures that the military will forever heed party commands"),
    ("he was running quickly to the stations", "he runs quick to the station"),
    ("the quick brown fox jumps over the lazy dog", "the lazy dog is jumped over by a quick brown fox"),
    ("a b c d e f", "f e d c b a"),
    ("players played the games", "the player plays a game"),
    ("completely unrelated words here", "nothing in common at all"),
    ("connection connected connecting", "connect connects connections"),
    ("the the the", "the cat"),
]

for hyp, ref in PAIRS:
    h, r = hyp.split(), ref.split()
    porter = meteor_score([r], h, stemmer=PorterStemmer(), wordnet=NoSynonyms())
    snowball = meteor_score([r], h, stemmer=SnowballStemmer("english"), wordnet=NoSynonyms())
    mark = "" if porter == snowball else f"   # DIFFERS with Snowball: {snowball!r}"
    print(f'    ("{hyp}", "{ref}", {porter!r}),{mark}')
