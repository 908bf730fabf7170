from exgrpo_cli.replay.methods import ExgrpoReplay, Members


class OneNewest(ExgrpoReplay):
    """ExGRPO, but one replayed question a step, its newest stored response beside K-1 fresh ones."""

    def how_many(self, buffer):
        return min(1, buffer.num_questions)

    def members(self, candidates, scores, rng, group_size):
        return Members(picks=(len(candidates) - 1,), fresh=group_size - 1)
