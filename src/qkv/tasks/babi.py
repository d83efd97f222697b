"""Generated bAbI-style question answering (Weston et al. 2015, "Towards AI-Complete Question
Answering: A Set of Prerequisite Toy Tasks", arXiv:1502.05698).

bAbI was produced by a simulator; these stories come from a seeded simulator of the same world
(people walking between rooms, picking up and dropping objects) and the same question types:

=================  ==================================================  =============================
name               bAbI task                                           question / answer
=================  ==================================================  =============================
``babi-single``    1, single supporting fact                           "where is mary" / a room
``babi-two``       2, two supporting facts                             "where is the milk" / a room
``babi-counting``  7, counting                                         "how many objects is mary
                                                                       carrying" / none..three
=================  ==================================================  =============================

A story is ``min_sentences..max_sentences`` sentences followed by one question whose answer the
story determines. Stories are assigned to train/valid/test by a hash of their text, so the
held-out stories never occur in training. Words are lower case, punctuation dropped.

Batches: ``story (B, S, J)`` long word ids (0 = padding), ``story_mask (B, S)`` bool (True = a
real sentence, sentences in story order), ``query (B, Jq)`` long, ``labels (B,)`` long (the
answer's word id). Meta key ``supporting (B, S)`` bool marks the supporting facts (for the
attention metric ``support_hit``: how often the last hop's most attended sentence is one of them).
"""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import SPLITS, split_of, stable_seed
from qkv.tasks.classify import TensorTask
from qkv.tasks.vocab import WordVocab

__all__ = ["BabiTask", "BabiSingle", "BabiTwo", "BabiCounting", "PEOPLE", "PLACES", "OBJECTS"]

PEOPLE = ("mary", "john", "daniel", "sandra")
PLACES = ("bathroom", "hallway", "garden", "office", "bedroom", "kitchen")
OBJECTS = ("football", "apple", "milk")
MOVES = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
TAKES = ("picked up", "got", "grabbed", "took")
DROPS = ("dropped", "discarded", "put down", "left")
NUMBERS = ("none", "one", "two", "three")

Story = Tuple[List[str], str, str, List[int]]  # sentences, question, answer, supporting indices


def _vocabulary() -> List[str]:
    words = "where is the how many objects carrying nothing".split() + list(PEOPLE) + list(PLACES) + list(OBJECTS) + list(NUMBERS)
    for phrase in MOVES + TAKES + DROPS:
        words += phrase.split()
    return words


class _World:
    """Positions of people and objects as a story unfolds."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.where: Dict[str, str] = {}
        self.holder: Dict[str, Optional[str]] = {o: None for o in OBJECTS}
        self.place_of: Dict[str, str] = {}  # object -> room where it was dropped/last seen

    def move(self, person: str) -> str:
        place = self.rng.choice([p for p in PLACES if p != self.where.get(person)])
        self.where[person] = place
        return f"{person} {self.rng.choice(MOVES)} the {place}"

    def carried(self, person: str) -> List[str]:
        return [o for o, h in self.holder.items() if h == person]


class BabiTask(TensorTask):
    """Base of the generated bAbI-style tasks (see the module docstring).

    Args:
        n_train, n_valid, n_test: stories per split (bAbI's "10k" setting has 10,000 training
            questions; its "1k" setting 1,000).
        min_sentences, max_sentences: story length range (sentences before the question).
        seed: the simulator's seed (the same seed always gives the same stories).
    """

    meta_keys = ("supporting",)

    def model_hints(self) -> Dict[str, Any]:
        """The vocabulary, the classification head and the most sentences a story holds."""
        return {**super().model_hints(), "max_sentences": self.max_sentences}

    def __init__(self, *, n_train: int = 10000, n_valid: int = 500, n_test: int = 1000, min_sentences: int = 2,
                 max_sentences: int = 10, seed: int = 0) -> None:
        for name, value in (("n_train", n_train), ("n_valid", n_valid), ("n_test", n_test),
                            ("min_sentences", min_sentences), ("max_sentences", max_sentences)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if max_sentences < min_sentences:
            raise ValueError(f"max_sentences must be >= min_sentences = {min_sentences}, got {max_sentences}")
        self.min_sentences, self.max_sentences = min_sentences, max_sentences
        self.vocab = WordVocab(sorted(set(_vocabulary())))
        counts = {"train": n_train, "valid": n_valid, "test": n_test}
        stories: Dict[str, List[Story]] = {s: [] for s in SPLITS}
        rng = random.Random(stable_seed(self.registry_name, seed))
        seen = set()
        tries = 0
        while any(len(stories[s]) < counts[s] for s in SPLITS):
            tries += 1
            if tries > 50 * sum(counts.values()):
                raise ValueError(f"{self.registry_name}: could not draw {counts} distinct stories; lower the counts")
            story = self.story(rng, rng.randint(min_sentences, max_sentences))
            text = " | ".join(story[0]) + " ? " + story[1]
            split = split_of(text)
            if text in seen or len(stories[split]) >= counts[split]:
                continue
            seen.add(text)
            stories[split].append(story)
        self.stories = stories
        self.sentence_len = max(len(s.split()) for part in stories.values() for st in part for s in st[0])
        self.query_len = max(len(st[1].split()) for part in stories.values() for st in part)
        self._splits = {s: self.encode(stories[s]) for s in SPLITS}
        self._check_splits()

    def story(self, rng: random.Random, n: int) -> Story:
        """One story of ``n`` sentences: ``(sentences, question, answer, supporting indices)``."""
        raise NotImplementedError  # abstract: subclasses implement it

    def encode(self, stories: List[Story]) -> Dict[str, Tensor]:
        """Pad stories into ``story (N, S, J)``, ``story_mask (N, S)``, ``query (N, Jq)``,
        ``labels (N,)`` and ``supporting (N, S)``."""
        N, S, J = len(stories), self.max_sentences, self.sentence_len
        story = torch.zeros(N, S, J, dtype=torch.long)
        mask = torch.zeros(N, S, dtype=torch.bool)
        query = torch.zeros(N, self.query_len, dtype=torch.long)
        labels = torch.zeros(N, dtype=torch.long)
        supporting = torch.zeros(N, S, dtype=torch.bool)
        for n, (sentences, question, answer, support) in enumerate(stories):
            for i, sentence in enumerate(sentences):
                ids = self.vocab.encode(sentence)
                story[n, i, : len(ids)] = torch.tensor(ids)
            mask[n, : len(sentences)] = True
            q = self.vocab.encode(question)
            query[n, : len(q)] = torch.tensor(q)
            labels[n] = self.vocab.encode(answer)[0]
            supporting[n, support] = True
        return {"story": story, "story_mask": mask, "query": query, "labels": labels, "supporting": supporting}

    def _metrics(self, outputs: List[Any], batches: List[Dict[str, Tensor]]) -> Dict[str, float]:
        metrics = super()._metrics(outputs, batches)
        if all(isinstance(o.weights, (list, tuple)) and o.weights for o in outputs):
            hits = torch.cat([
                b["supporting"].gather(1, o.weights[-1].argmax(-1, keepdim=True)).squeeze(1)
                for o, b in zip(outputs, batches)])
            metrics["support_hit"] = hits.float().mean().item()
        return metrics

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        """``n`` training stories as text."""
        return [{"story": ". ".join(s) + ".", "question": q + "?", "answer": a}
                for s, q, a, _ in self.stories["train"][:n]]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Each hop's weights over the sentences of a held-out story (``text``: the story's index)."""
        from .views import story_view, text_index

        pick = text_index(text, len(self.stories["test"]), "story")
        sentences, question, answer, _ = self.stories["test"][pick]
        batch = self._take("test", torch.tensor([pick]), meta=True)
        return story_view(model, batch, list(sentences), question, answer, self.vocab.decode)


@register("task", "babi-single")
class BabiSingle(BabiTask):
    """bAbI task 1, single supporting fact: "mary went to the office ... where is mary? office"."""

    def story(self, rng: random.Random, n: int) -> Story:
        world = _World(rng)
        sentences, last = [], {}
        for i in range(n):
            person = rng.choice(PEOPLE)
            sentences.append(world.move(person))
            last[person] = i
        person = rng.choice(sorted(last))
        return sentences, f"where is {person}", world.where[person], [last[person]]


@register("task", "babi-two")
class BabiTwo(BabiTask):
    """bAbI task 2, two supporting facts: "john took the milk ... john went to the garden ... where
    is the milk? garden" (the object's holder's last move, or where it was dropped)."""

    def __init__(self, *, min_sentences: int = 4, max_sentences: int = 14, **kwargs: Any) -> None:
        super().__init__(min_sentences=min_sentences, max_sentences=max_sentences, **kwargs)

    def story(self, rng: random.Random, n: int) -> Story:
        for _ in range(100):
            out = self._attempt(rng, n)
            if out is not None:
                return out
        raise ValueError(f"could not draw a two-supporting-fact story of {n} sentences")

    def _attempt(self, rng: random.Random, n: int) -> Optional[Story]:
        world = _World(rng)
        sentences: List[str] = []
        moved: Dict[str, int] = {}  # person -> index of the last move
        taken: Dict[str, int] = {}  # object -> index of the take
        dropped: Dict[str, Tuple[str, List[int]]] = {}  # object -> (room, supporting)
        for i in range(n):
            person = rng.choice(PEOPLE)
            carried = world.carried(person)
            free = [o for o in OBJECTS if world.holder[o] is None]
            r = rng.random()
            if person in world.where and free and r < 0.3:
                obj = rng.choice(free)
                world.holder[obj] = person
                taken[obj] = i
                dropped.pop(obj, None)
                sentences.append(f"{person} {rng.choice(TAKES)} the {obj}")
            elif carried and r < 0.45:
                obj = rng.choice(carried)
                world.holder[obj] = None
                dropped[obj] = (world.where[person], [taken[obj], moved[person], i])
                sentences.append(f"{person} {rng.choice(DROPS)} the {obj}")
            else:
                sentences.append(world.move(person))
                moved[person] = i
        answerable = []
        for obj in OBJECTS:
            holder = world.holder[obj]
            if holder is not None:
                answerable.append((obj, world.where[holder], sorted({taken[obj], moved[holder]})))
            elif obj in dropped:
                answerable.append((obj, dropped[obj][0], sorted(set(dropped[obj][1]))))
        if not answerable:
            return None
        obj, place, support = rng.choice(answerable)
        return sentences, f"where is the {obj}", place, support


@register("task", "babi-counting")
class BabiCounting(BabiTask):
    """bAbI task 7, counting: "how many objects is mary carrying? two" (none..three)."""

    def __init__(self, *, min_sentences: int = 2, max_sentences: int = 12, **kwargs: Any) -> None:
        super().__init__(min_sentences=min_sentences, max_sentences=max_sentences, **kwargs)

    def story(self, rng: random.Random, n: int) -> Story:
        world = _World(rng)
        sentences: List[str] = []
        events: Dict[str, List[int]] = {p: [] for p in PEOPLE}
        for i in range(n):
            person = rng.choice(PEOPLE)
            carried = world.carried(person)
            free = [o for o in OBJECTS if world.holder[o] is None]
            r = rng.random()
            if free and r < 0.45:
                obj = rng.choice(free)
                world.holder[obj] = person
                sentences.append(f"{person} {rng.choice(TAKES)} the {obj}")
                events[person].append(i)
            elif carried and r < 0.7:
                obj = rng.choice(carried)
                world.holder[obj] = None
                sentences.append(f"{person} {rng.choice(DROPS)} the {obj}")
                events[person].append(i)
            else:
                sentences.append(world.move(person))
        person = rng.choice(PEOPLE)
        return sentences, f"how many objects is {person} carrying", NUMBERS[len(world.carried(person))], events[person]
