"""The DFlash training objective: anchors, blocks, masks and the weighted loss."""
